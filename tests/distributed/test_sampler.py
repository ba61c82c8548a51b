"""Properties of the elastic sampler: a changing world size never skips or repeats data."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchnext.distributed.sampler import ElasticSampler, SamplerConfig, split_range


@given(n=st.integers(0, 200), world=st.integers(1, 17))
def test_split_range_partitions(n: int, world: int) -> None:
    covered = []
    for rank in range(world):
        start, stop = split_range(n, rank, world)
        covered.extend(range(start, stop))
    assert covered == list(range(n))


@settings(max_examples=150, deadline=None)
@given(
    dataset_size=st.integers(1, 120),
    batch=st.integers(1, 40),
    worlds=st.lists(st.integers(1, 9), min_size=1, max_size=60),
    aborts=st.lists(st.booleans(), min_size=1, max_size=60),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_world_size_changes_never_skip_or_repeat(
    dataset_size: int,
    batch: int,
    worlds: list[int],
    aborts: list[bool],
    drop_last: bool,
    shuffle: bool,
) -> None:
    assume(not (drop_last and batch > dataset_size))  # no full batch: nothing to sample
    sampler = ElasticSampler(
        SamplerConfig(
            dataset_size=dataset_size,
            global_batch_size=batch,
            seed=3,
            shuffle=shuffle,
            drop_last=drop_last,
        )
    )
    seen: dict[int, list[int]] = {}
    for i, world in enumerate(worlds):
        sampler.global_batch()  # rolls the epoch over when the last one ended
        epoch = sampler.epoch
        shares = [sampler.indices(r, world) for r in range(world)]
        if aborts[i % len(aborts)]:
            # Discarded step: nothing advances, the same batch is redone next.
            assert sum(shares, []) == sampler.global_batch()
            continue
        seen.setdefault(int(epoch), []).extend(sum(shares, []))
        sampler.commit()
    for epoch, indices in seen.items():
        assert len(indices) == len(set(indices)), f"epoch {epoch} repeated a sample"
        assert set(indices) <= set(range(dataset_size))
    # Every finished epoch covered the whole dataset (minus the dropped tail).
    for epoch in seen:
        if epoch < sampler.epoch:
            expected = dataset_size - (dataset_size % batch if drop_last else 0)
            assert len(seen[epoch]) == expected


def test_redo_on_fewer_members_gives_same_global_batch() -> None:
    sampler = ElasticSampler(SamplerConfig(dataset_size=100, global_batch_size=12, seed=1))
    four = [sampler.indices(r, 4) for r in range(4)]
    three = [sampler.indices(r, 3) for r in range(3)]
    assert sum(four, []) == sum(three, [])
    assert [len(s) for s in three] == [4, 4, 4]


def test_state_roundtrip_and_seed_mismatch() -> None:
    cfg = SamplerConfig(dataset_size=50, global_batch_size=8, seed=5)
    a = ElasticSampler(cfg)
    for _ in range(9):
        a.commit()
    b = ElasticSampler(cfg)
    b.load_state_dict(a.state_dict())
    assert b.global_batch() == a.global_batch()
    assert b.epoch == 1
    other = ElasticSampler(SamplerConfig(dataset_size=50, global_batch_size=8, seed=6))
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(a.state_dict())


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="global_batch_size"):
        SamplerConfig(dataset_size=10, global_batch_size=0)
    with pytest.raises(ValueError, match="dataset_size"):
        SamplerConfig(dataset_size=0, global_batch_size=1)


def test_iteration_yields_the_bound_members_shares_from_the_committed_position() -> None:
    sampler = ElasticSampler(SamplerConfig(dataset_size=10, global_batch_size=4, seed=2))
    assert isinstance(sampler, torch.utils.data.Sampler) and len(sampler) == 3
    sampler.commit()  # one step committed: iteration starts at the second
    sampler.bind(1, 3)
    it = iter(sampler)
    got = [next(it) for _ in range(4)]  # steps 2 and 3 of epoch 0, then epoch 1
    reference = ElasticSampler(SamplerConfig(dataset_size=10, global_batch_size=4, seed=2))
    reference.commit()
    expected = []
    for _ in range(4):
        expected.append(reference.indices(1, 3))
        reference.commit()
    assert got == expected
    assert [p[:2] for p in sampler.issued] == [(0, 4), (0, 8), (1, 0), (1, 4)]
    assert sampler.position() == (0, 4, 1, 3)  # iterating commits nothing
    with pytest.raises(ValueError, match="rank=3 is outside"):
        sampler.bind(3, 3)


def test_empty_shares_are_skipped_and_a_member_that_never_gets_one_is_named() -> None:
    sampler = ElasticSampler(SamplerConfig(dataset_size=5, global_batch_size=2, shuffle=False))
    sampler.bind(1, 2)  # steps of 2, 2 and 1 samples: member 1 has none in the third
    it = iter(sampler)
    assert [next(it) for _ in range(3)] == [[1], [3], [1]]  # then epoch 1 begins again
    assert [p[:2] for p in sampler.issued] == [(0, 0), (0, 2), (1, 0)]
    sampler.bind(2, 3)  # a batch of 2 over 3 members: member 2 never gets a sample
    with pytest.raises(ValueError, match="member 2 of 3 gets no sample in any step"):
        next(iter(sampler))
    loader = torch.utils.data.DataLoader(list(range(5)), batch_sampler=sampler)
    sampler.bind(0, 2)
    assert next(iter(loader)).tolist() == [0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_feed_follows_membership_changes_with_and_without_workers(
    num_workers: int,
) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from torchnext.distributed.training.loader import LoaderFeed

    sampler = ElasticSampler(SamplerConfig(dataset_size=60, global_batch_size=6, seed=3))
    loader = DataLoader(
        TensorDataset(torch.arange(60)), batch_sampler=sampler, num_workers=num_workers
    )
    feed = LoaderFeed(loader, sampler)
    # Member 0's view: world 3 for two steps, a redo, then world 2 (a member died), then 3.
    plan = [(0, 3), (0, 3), (0, 2), (0, 2), (1, 3)]
    for i, (rank, world) in enumerate(plan):
        (got,) = feed.batch(rank, world, empty=False)
        if i == 2:
            again = feed.batch(rank, world, empty=False)
            assert again[0] is got  # redone: the same batch
        want = sampler.indices(rank, world)
        assert got.tolist() == want, (i, got.tolist(), want)
        sampler.commit()
    feed.close()
