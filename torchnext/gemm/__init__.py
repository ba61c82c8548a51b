"""Autotuned GEMM with fused epilogues, block-scaled and grouped GEMM, and decode GEMV, on the
torch people run (2.13 and older, CPU or any GPU).

The public names are assembled here as the parts land; see each module's docstring.
"""
