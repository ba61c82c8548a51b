"""A tiny RGB canvas that writes PNG files with ``zlib`` and ``struct`` only.

Use it for simple line plots where a plotting library would be a heavy dependency
(the demo's loss curve). It draws lines, filled rectangles and text in a built-in
5x7 bitmap font (upper-case letters, digits, a little punctuation; lower case is
drawn upper case). What not to assume: no anti-aliasing, no fonts beyond that one,
no alpha; coordinates are pixels with the origin at the top left.

Legend: ``img_HW3`` is the canvas, height x width x RGB, ``uint8``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["Canvas", "Color"]

Color = tuple[int, int, int]

# Column-major 5x7 glyphs (bit 0 is the top row), the classic HD44780-style shapes.
_FONT: dict[str, tuple[int, int, int, int, int]] = {
    "0": (0x3E, 0x51, 0x49, 0x45, 0x3E),
    "1": (0x00, 0x42, 0x7F, 0x40, 0x00),
    "2": (0x42, 0x61, 0x51, 0x49, 0x46),
    "3": (0x21, 0x41, 0x45, 0x4B, 0x31),
    "4": (0x18, 0x14, 0x12, 0x7F, 0x10),
    "5": (0x27, 0x45, 0x45, 0x45, 0x39),
    "6": (0x3C, 0x4A, 0x49, 0x49, 0x30),
    "7": (0x01, 0x71, 0x09, 0x05, 0x03),
    "8": (0x36, 0x49, 0x49, 0x49, 0x36),
    "9": (0x06, 0x49, 0x49, 0x29, 0x1E),
    "A": (0x7E, 0x11, 0x11, 0x11, 0x7E),
    "B": (0x7F, 0x49, 0x49, 0x49, 0x36),
    "C": (0x3E, 0x41, 0x41, 0x41, 0x22),
    "D": (0x7F, 0x41, 0x41, 0x22, 0x1C),
    "E": (0x7F, 0x49, 0x49, 0x49, 0x41),
    "F": (0x7F, 0x09, 0x09, 0x09, 0x01),
    "G": (0x3E, 0x41, 0x49, 0x49, 0x7A),
    "H": (0x7F, 0x08, 0x08, 0x08, 0x7F),
    "I": (0x00, 0x41, 0x7F, 0x41, 0x00),
    "J": (0x20, 0x40, 0x41, 0x3F, 0x01),
    "K": (0x7F, 0x08, 0x14, 0x22, 0x41),
    "L": (0x7F, 0x40, 0x40, 0x40, 0x40),
    "M": (0x7F, 0x02, 0x0C, 0x02, 0x7F),
    "N": (0x7F, 0x04, 0x08, 0x10, 0x7F),
    "O": (0x3E, 0x41, 0x41, 0x41, 0x3E),
    "P": (0x7F, 0x09, 0x09, 0x09, 0x06),
    "Q": (0x3E, 0x41, 0x51, 0x21, 0x5E),
    "R": (0x7F, 0x09, 0x19, 0x29, 0x46),
    "S": (0x46, 0x49, 0x49, 0x49, 0x31),
    "T": (0x01, 0x01, 0x7F, 0x01, 0x01),
    "U": (0x3F, 0x40, 0x40, 0x40, 0x3F),
    "V": (0x1F, 0x20, 0x40, 0x20, 0x1F),
    "W": (0x3F, 0x40, 0x38, 0x40, 0x3F),
    "X": (0x63, 0x14, 0x08, 0x14, 0x63),
    "Y": (0x07, 0x08, 0x70, 0x08, 0x07),
    "Z": (0x61, 0x51, 0x49, 0x45, 0x43),
    ".": (0x00, 0x60, 0x60, 0x00, 0x00),
    "-": (0x08, 0x08, 0x08, 0x08, 0x08),
    ":": (0x00, 0x36, 0x36, 0x00, 0x00),
    " ": (0x00, 0x00, 0x00, 0x00, 0x00),
    "=": (0x14, 0x14, 0x14, 0x14, 0x14),
    "(": (0x00, 0x1C, 0x22, 0x41, 0x00),
    ")": (0x00, 0x41, 0x22, 0x1C, 0x00),
    "/": (0x20, 0x10, 0x08, 0x04, 0x02),
    "%": (0x23, 0x13, 0x08, 0x64, 0x62),
    "+": (0x08, 0x08, 0x3E, 0x08, 0x08),
    ",": (0x00, 0x50, 0x30, 0x00, 0x00),
    "_": (0x40, 0x40, 0x40, 0x40, 0x40),
}


class Canvas:
    """An RGB image to draw on and save as PNG."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        if width <= 0 or height <= 0:
            raise ValueError(f"Canvas: width={width} and height={height} must be positive.")
        self.width = width
        self.height = height
        self.img_HW3 = np.empty((height, width, 3), dtype=np.uint8)
        self.img_HW3[:] = background

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the rectangle with corners (x0, y0) and (x1, y1), inclusive, clipped."""
        xa, xb = sorted((int(x0), int(x1)))
        ya, yb = sorted((int(y0), int(y1)))
        xa, ya = max(xa, 0), max(ya, 0)
        xb, yb = min(xb, self.width - 1), min(yb, self.height - 1)
        if xa <= xb and ya <= yb:
            self.img_HW3[ya : yb + 1, xa : xb + 1] = color

    def line(
        self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 1
    ) -> None:
        """A straight segment, ``width`` pixels thick, clipped to the canvas."""
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        xs = np.rint(np.linspace(x0, x1, n)).astype(np.int64)
        ys = np.rint(np.linspace(y0, y1, n)).astype(np.int64)
        half = width // 2
        for dx in range(-half, width - half):
            for dy in range(-half, width - half):
                px, py = xs + dx, ys + dy
                keep = (px >= 0) & (px < self.width) & (py >= 0) & (py < self.height)
                self.img_HW3[py[keep], px[keep]] = color

    def polyline(self, xs: list[float], ys: list[float], color: Color, width: int = 1) -> None:
        for i in range(1, len(xs)):
            self.line(xs[i - 1], ys[i - 1], xs[i], ys[i], color, width)

    def dashed_vline(self, x: float, y0: float, y1: float, color: Color, dash: int = 6) -> None:
        ya, yb = sorted((int(y0), int(y1)))
        for y in range(ya, yb, 2 * dash):
            self.line(x, y, x, min(y + dash, yb), color)

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 1) -> int:
        """Draw ``text`` with its top-left corner at (x, y); returns the x after the last glyph."""
        for ch in text.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for col, bits in enumerate(glyph):
                for row in range(7):
                    if bits >> row & 1:
                        px, py = x + col * scale, y + row * scale
                        self.rect(px, py, px + scale - 1, py + scale - 1, color)
            x += 6 * scale
        return x

    @staticmethod
    def text_width(text: str, scale: int = 1) -> int:
        return 6 * scale * len(text)

    def to_png(self) -> bytes:
        """The image as PNG bytes (8-bit RGB, no filtering, zlib level 6)."""
        rows = np.concatenate(
            [np.zeros((self.height, 1), dtype=np.uint8), self.img_HW3.reshape(self.height, -1)],
            axis=1,
        )
        raw = zlib.compress(rows.tobytes(), 6)

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + tag
                + data
                + struct.pack(">I", zlib.crc32(tag + data))
            )

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", raw)
            + chunk(b"IEND", b"")
        )

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(self.to_png())
        return out
