"""Padding, shifted targets, token-budget bucketing, rank split and exact resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.batching import (
    TARGET_ROWS_MULTIPLE,
    BatchIterator,
    RaggedIds,
    batch_by_tokens,
    collate,
)

# Deliberately not 0/2/3: nothing here may assume the tokenizer's values.
PAD, BOS, EOS = 7, 5, 6
IDS = {"pad_id": PAD, "bos_id": BOS, "eos_id": EOS}


def corpus(n: int, seed: int = 0, max_len: int = 30) -> tuple[list[list[int]], list[list[int]]]:
    """`n` random pairs of correlated lengths; token ids >= 10 never collide with specials."""
    rng = np.random.default_rng(seed)
    src_lens = rng.integers(1, max_len, size=n)
    tgt_lens = np.clip(src_lens + rng.integers(-3, 4, size=n), 1, None)
    src = [rng.integers(10, 100, size=k).tolist() for k in src_lens]
    tgt = [rng.integers(10, 100, size=k).tolist() for k in tgt_lens]
    return src, tgt


def assert_within_budget(batch, max_tokens: int, max_sentences: int | None = None) -> None:
    n = batch.src.shape[0]
    if n > 1:  # a lone example over the budget gets a batch of its own
        assert batch.src.numel() <= max_tokens
        assert batch.tgt_in.numel() <= max_tokens
    if max_sentences:
        assert n <= max_sentences


def assert_consistent(batch, src, tgt) -> None:
    """The batch holds exactly examples `batch.indices`, padded, shifted and masked right."""
    for row, index in enumerate(batch.indices):
        s, t = src[index], tgt[index]
        assert batch.src[row, : len(s)].tolist() == s
        assert batch.src_pad_mask[row].tolist() == [i >= len(s) for i in range(batch.src.shape[1])]
        assert (batch.src[row][batch.src_pad_mask[row]] == PAD).all()
        assert batch.tgt_in[row, : len(t) + 1].tolist() == [BOS, *t]
        assert batch.tgt_out[row, : len(t) + 1].tolist() == [*t, EOS]
        width = batch.tgt_in.shape[1]
        assert batch.tgt_pad_mask[row].tolist() == [i > len(t) for i in range(width)]
        assert (batch.tgt_in[row][batch.tgt_pad_mask[row]] == PAD).all()
        assert (batch.tgt_out[row][batch.tgt_pad_mask[row]] == PAD).all()
    assert batch.n_src_tokens == int((~batch.src_pad_mask).sum())
    assert batch.n_tgt_tokens == int((~batch.tgt_pad_mask).sum())


# --- collate ----------------------------------------------------------------------------------


def test_collate_pads_shifts_and_masks():
    batch = collate([[11, 12, 13], [14]], [[21], [22, 23]], indices=[4, 9], **IDS)
    assert batch.src.tolist() == [[11, 12, 13], [14, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 21, PAD], [BOS, 22, 23]]
    assert batch.tgt_out.tolist() == [[21, EOS, PAD], [22, 23, EOS]]
    assert batch.src_pad_mask.tolist() == [[False, False, False], [False, True, True]]
    assert batch.tgt_pad_mask.tolist() == [[False, False, True], [False, False, False]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens, batch.indices) == (4, 5, [4, 9])
    assert batch.src.dtype == batch.tgt_in.dtype == torch.long
    assert batch.src_pad_mask.dtype == torch.bool
    # tgt_in and tgt_out are the same sequence shifted by one.
    keep = ~batch.tgt_pad_mask[:, 1:]
    assert torch.equal(batch.tgt_in[:, 1:][keep], batch.tgt_out[:, :-1][keep])


def test_collate_without_targets_for_inference():
    batch = collate([[11, 12], [13]], None, indices=[0, 1], **IDS)
    assert batch.tgt_in.shape == batch.tgt_out.shape == batch.tgt_pad_mask.shape == (2, 0)
    assert batch.n_tgt_tokens == 0
    assert batch.to("cpu").src.tolist() == [[11, 12], [13, PAD]]


def test_batch_by_tokens_sorts_covers_and_keeps_the_budget():
    lens = [5, 1, 9, 3, 3, 7, 2, 40]
    batches = batch_by_tokens(lens, None, max_tokens=10, max_sentences=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lens)))
    flat = [i for b in batches for i in b]
    assert [lens[i] for i in flat] == sorted(lens)
    assert flat.index(3) < flat.index(4)  # ties keep input order
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lens[i] for i in b) <= 10
    assert [7] in batches  # over the budget alone: a batch of its own


# --- BatchIterator ----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    per_rank=st.integers(1, 20),
    max_tokens=st.integers(8, 120),
    max_sentences=st.one_of(st.none(), st.integers(1, 8)),
    world_size=st.integers(1, 3),
    seed=st.integers(0, 3),
    pool_batches=st.integers(1, 5),
    pad_multiple=st.sampled_from([1, 2, 3, 8]),
)
def test_every_example_once_per_epoch_within_budget(
    per_rank, max_tokens, max_sentences, world_size, seed, pool_batches, pad_multiple
):
    n = per_rank * world_size  # else single-example batches may not share out evenly
    src, tgt = corpus(n, seed)
    ranks = [
        BatchIterator(
            src,
            tgt,
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            seed=seed,
            pool_batches=pool_batches,
            rank=rank,
            world_size=world_size,
            pad_multiple=pad_multiple,
            **IDS,
        )
        for rank in range(world_size)
    ]
    for epoch in range(2):
        lengths = [len(iterator) for iterator in ranks]
        shares = [list(iterator) for iterator in ranks]
        assert [len(share) for share in shares] == lengths
        assert len(set(lengths)) == 1, "every rank gets the same number of batches"
        seen = []
        for batch in (batch for share in shares for batch in share):
            assert_within_budget(batch, max_tokens, max_sentences)
            assert_consistent(batch, src, tgt)
            seen += batch.indices
        assert sorted(seen) == list(range(n)), "disjoint, and together the whole epoch"
        assert all((it.epoch, it.position) == (epoch + 1, 0) for it in ranks)


def make_iterator(src, tgt, **kwargs) -> BatchIterator:
    settings_ = {"max_tokens": 64, "seed": 1, "pool_batches": 4, **IDS, **kwargs}
    return BatchIterator(src, tgt, **settings_)


def indices_of(batches) -> list[list[int]]:
    return [batch.indices for batch in batches]


def test_same_seed_same_batches_other_epoch_or_seed_other_batches():
    src, tgt = corpus(300)
    first = make_iterator(src, tgt)
    epoch0, epoch1 = indices_of(first), indices_of(first)
    assert indices_of(make_iterator(src, tgt)) == epoch0
    assert epoch1 != epoch0
    assert sorted(map(sorted, epoch1)) != sorted(map(sorted, epoch0)), "new batches, not only order"
    assert indices_of(make_iterator(src, tgt, seed=2)) != epoch0


def test_unshuffled_iteration_is_one_sorted_pass():
    src, tgt = corpus(100)
    iterator = make_iterator(src, tgt, shuffle=False, pool_batches=10**6)
    order = [i for b in iterator.epoch_indices() for i in b]
    widths = [max(len(src[i]), len(tgt[i]) + 1) for i in order]
    assert widths == sorted(widths)
    assert iterator.epoch_indices(5) == iterator.epoch_indices(0)


def test_restored_iterator_continues_exactly_where_it_stopped():
    src, tgt = corpus(200)
    reference = make_iterator(src, tgt)
    expected = indices_of(reference) + indices_of(reference)  # two whole epochs
    per_epoch = len(expected) // 2

    stopped = make_iterator(src, tgt)
    seen = []
    for batch in stopped:
        seen.append(batch.indices)
        if len(seen) == per_epoch // 2:
            break
    state = stopped.state_dict()
    assert (state["epoch"], state["position"]) == (0, per_epoch // 2)

    resumed = make_iterator(src, tgt)
    resumed.load_state_dict(state)
    seen += indices_of(resumed) + indices_of(resumed)
    assert seen[: len(expected)] == expected


def test_state_at_the_end_of_an_epoch_points_at_the_next():
    src, tgt = corpus(50)
    iterator = make_iterator(src, tgt)
    *_, last = iter(iterator)  # exhausts epoch 0 and rolls over
    assert (iterator.epoch, iterator.position) == (1, 0)

    stopped = make_iterator(src, tgt)
    for count, _ in enumerate(stopped, start=1):
        if count == len(stopped):
            break  # stopped right after the last batch, before the generator rolled over
    assert (stopped.state_dict()["epoch"], stopped.state_dict()["position"]) == (1, 0)
    assert indices_of(stopped) == indices_of(iterator)  # the next iteration is epoch 1


def test_state_from_other_settings_is_refused():
    src, tgt = corpus(50)
    state = make_iterator(src, tgt).state_dict()
    with pytest.raises(ValueError, match="max_tokens"):
        make_iterator(src, tgt, max_tokens=32).load_state_dict(state)
    with pytest.raises(ValueError, match="n_examples"):
        make_iterator(src[:40], tgt[:40]).load_state_dict(state)


def test_ranks_split_an_epoch_into_disjoint_equal_shares():
    src, tgt = corpus(101)
    ranks = [make_iterator(src, tgt, rank=r, world_size=3) for r in range(3)]
    shares = [indices_of(iterator) for iterator in ranks]
    assert len({len(share) for share in shares}) == 1
    flat = [i for share in shares for batch in share for i in batch]
    assert sorted(flat) == list(range(101))


def global_plan(iterators) -> list[list[int]]:
    """The batches of ranks' iterators interleaved: batch r + k * world_size is rank r's k-th."""
    shares = [indices_of(iterator) for iterator in iterators]
    return [batch for step in zip(*shares, strict=True) for batch in step]


@pytest.mark.parametrize("saved_by, resumed_by", [(4, 1), (4, 2), (2, 1), (1, 2), (2, 4)])
def test_a_state_saved_by_some_ranks_continues_in_others_over_the_same_plan(saved_by, resumed_by):
    """A run of 4 batches an update (`split`) resumes in any number of ranks dividing 4: the
    ranks together take the rest of the same plan, in the same order."""
    src, tgt = corpus(301)
    whole = indices_of(make_iterator(src, tgt, split=4))
    assert len(whole) % 4 == 0 and len(whole) > 12
    stopped = [
        make_iterator(src, tgt, rank=r, world_size=saved_by, split=4) for r in range(saved_by)
    ]
    taken = 8  # two updates
    for iterator in stopped:
        for count, _ in enumerate(iterator, start=1):
            if count == taken // saved_by:
                break
    states = [iterator.state_dict() for iterator in stopped]
    resumed = [make_iterator(src, tgt, rank=r, world_size=resumed_by) for r in range(resumed_by)]
    for iterator in resumed:
        iterator.load_state_dict(states[0])
    assert global_plan(resumed) == whole[taken:]


def test_a_state_from_before_split_continues_its_own_plan():
    """A run of update_freq 2 saved before `split` existed cut its epochs for its world size:
    its state has no "split", and resumes that plan, not the one cut in whole updates."""
    src, tgt = corpus(301)
    old = make_iterator(src, tgt)
    old_plan = indices_of(old)
    assert len(old_plan) % 2 == 1  # else both plans are the same and this proves nothing
    state = {**old.state_dict(), "epoch": 0, "position": 3}
    assert "split" not in state
    resumed = make_iterator(src, tgt, split=2)
    assert indices_of(make_iterator(src, tgt, split=2)) != old_plan
    resumed.load_state_dict(state)
    assert indices_of(resumed) == old_plan[3:]


def test_a_state_that_cannot_be_shared_out_is_refused():
    src, tgt = corpus(301)
    three = [make_iterator(src, tgt, rank=r, world_size=3) for r in range(3)]
    next(iter(three[0]))
    with pytest.raises(ValueError, match="cut for 3 ranks taking 3 batches together; 2 ranks"):
        make_iterator(src, tgt, rank=0, world_size=2).load_state_dict(three[0].state_dict())
    with pytest.raises(ValueError, match="multiple of world size"):
        make_iterator(src, tgt, world_size=2, split=3)


def test_a_refused_state_counts_one_rank_and_one_batch():
    src, tgt = corpus(301)
    one = make_iterator(src, tgt)
    next(iter(one))
    with pytest.raises(ValueError, match="cut for 1 rank taking 1 batch together; 2 ranks"):
        make_iterator(src, tgt, rank=0, world_size=2).load_state_dict(one.state_dict())


def test_an_epoch_smaller_than_an_update_is_cut_for_the_ranks_alone():
    """3 pairs and 4 batches an update: no multiple of 4 is within reach, so the epoch is
    cut as it was before `split` (its updates run across epochs), not refused."""
    one = make_iterator([[11, 13]] * 3, [[12]] * 3, max_tokens=64, split=4)
    assert sorted(i for b in indices_of(one) for i in b) == [0, 1, 2]
    # That plan depends on the number of ranks: another number is refused, not handed
    # batches that differ from the ones the run would have taken.
    two = make_iterator([[11, 13]] * 3, [[12]] * 3, max_tokens=64, world_size=2)
    with pytest.raises(ValueError, match="fewer examples than one update's 4 batches"):
        two.load_state_dict(one.state_dict())


def test_too_few_examples_for_the_ranks():
    with pytest.raises(ValueError, match="3 ranks"):
        len(make_iterator([[11]] * 2, [[12]] * 2, world_size=3))


def test_an_example_over_the_budget_gets_a_batch_of_its_own():
    src = [[11] * 5, [12] * 100, [13] * 6]
    tgt = [[21] * 5, [22] * 3, [23] * 6]
    batches = indices_of(make_iterator(src, tgt, max_tokens=20))
    assert [1] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2]


def test_ragged_ids_round_trip():
    rows = [[1, 2, 3], [], [4]]
    ragged = RaggedIds.from_lists(rows)
    assert len(ragged) == 3
    assert [ragged[i].tolist() for i in range(3)] == rows
    assert ragged.lengths().tolist() == [3, 0, 1]


def test_pad_multiple_one_is_the_batching_before_it():
    """`pad_multiple: 1` plans the batches planned before the option existed: the digest of
    this plan was taken from that code (commit 37b44f5)."""
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 60, size=(2, 500))
    src, tgt = ([[5] * int(n) for n in side] for side in lens)
    settings_ = {"max_tokens": 300, "seed": 3, "pool_batches": 5, "world_size": 2, "rank": 1}
    plan = [BatchIterator(src, tgt, **settings_, **IDS).epoch_indices(e) for e in range(3)]
    digest = hashlib.sha256(json.dumps(plan).encode()).hexdigest()
    assert digest == "6c876905d1f28560d7b2f635037e2474c6ad0d77bd974b82dde3455ab63dd222"
    rounded = BatchIterator(src, tgt, **settings_, **IDS, pad_multiple=2)
    assert [rounded.epoch_indices(e) for e in range(3)] != plan


@pytest.mark.parametrize("multiple", [2, 8])
def test_pad_multiple_gives_one_rounded_width_and_counts_of_eight(multiple):
    src, tgt = corpus(2000, max_len=70)
    iterator = make_iterator(src, tgt, max_tokens=1024, pad_multiple=multiple, pool_batches=10)
    batches = list(iterator)
    pool_ends = len(src) // iterator.pool_size + 1  # a pool's last batch takes what is left
    for batch in batches:
        assert batch.src.shape[1] == batch.tgt_in.shape[1] == batch.tgt_out.shape[1]
        width = batch.src.shape[1]
        assert width % multiple == 0
        longest = max(max(len(src[i]), len(tgt[i]) + 1) for i in batch.indices)
        assert width - multiple < longest <= width, "rounded up, not beyond"
        assert_within_budget(batch, 1024)
        assert_consistent(batch, src, tgt)
    odd = [b for b in batches if len(b.indices) % 8 and len(b.indices) > 8]
    assert len(odd) <= pool_ends
    shapes = {tuple(b.src.shape) for b in batches}
    widths = {b.src.shape[1] for b in batches}
    assert len(shapes) <= len(widths) + pool_ends + 4, "about one sentence count per width"
    plain = {(*b.src.shape, b.tgt_in.shape[1]) for b in make_iterator(src, tgt, max_tokens=1024)}
    assert len(shapes) < len(plain) / 2


def test_rounded_batches_train_as_the_plain_ones():
    """One width for both sides, a multiple of 8 sentences and the rows of real targets
    rounded up to TARGET_ROWS_MULTIPLE with ignored rows: the loss, the NLL and every
    gradient of a batch are those of the same examples batched at `pad_multiple: 1`."""
    from cli.training.trainer import batch_loss
    from model.transformer import ModelConfig, Transformer

    src, tgt = corpus(24, seed=3, max_len=20)
    rows = list(range(24))
    plain = make_iterator(src, tgt)._collate(np.array(rows))
    rounded = make_iterator(src, tgt, pad_multiple=8)._collate(np.array(rows))
    assert rounded.src.shape == rounded.tgt_in.shape and rounded.src.shape[1] % 8 == 0
    assert len(rounded.tgt_index) % TARGET_ROWS_MULTIPLE == 0
    assert len(rounded.tgt_index) > rounded.n_tgt_tokens == plain.n_tgt_tokens
    targets = rounded.real_targets(-100)
    assert (targets[rounded.n_tgt_tokens :] == -100).all()
    assert sorted(targets[: rounded.n_tgt_tokens].tolist()) == sorted(plain.real_targets().tolist())
    sizes = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2)
    config = ModelConfig(**sizes, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)
    model = Transformer(config, 100, 100, PAD).double()
    sums, grads = [], []
    for batch in (plain, rounded):
        model.zero_grad()
        loss, nll = batch_loss(model, batch, 0.1)
        loss.backward()
        sums.append((loss.item(), nll.item()))
        grads.append([p.grad.clone() for p in model.parameters()])
    # The loss runs its softmax and sums in float32 (model.loss), over other chunks here.
    assert sums[0] == pytest.approx(sums[1], rel=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_padding_efficiency_on_the_bundled_corpus():
    """Bucketing keeps most of each batch real tokens (here word counts stand in for pieces)."""
    from data.corpus import load_corpus

    ds = load_corpus("bundled:bible-es-en/train", "es", "en")
    src = lengths_only([len(text.split()) for text in ds["src"]])
    tgt = lengths_only([len(text.split()) for text in ds["tgt"]])
    iterator = BatchIterator(src, tgt, max_tokens=4096, seed=0, **IDS)
    s_len, t_len = src.lengths(), tgt.lengths() + 1
    real = padded = 0
    for rows in iterator.epoch_indices():
        real += s_len[rows].sum() + t_len[rows].sum()
        padded += len(rows) * (s_len[rows].max() + t_len[rows].max())
    assert real / padded >= 0.9


def lengths_only(lengths: list[int]) -> RaggedIds:
    """Rows of the given lengths (all zeros): enough to plan batches."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return RaggedIds(np.zeros(offsets[-1], dtype=np.int64), offsets)


@pytest.mark.parametrize("max_positions, multiple", [(63, 2), (100, 8)])
def test_pad_multiple_never_pads_past_max_positions(
    tmp_path, tiny_tokenizer, max_positions, multiple
):
    """Item 20: a pair of `data.max_len` = max_positions - 1 pieces is max_positions wide with
    BOS/EOS; `data.pad_multiple` rounded that past what the model takes, and the run died at
    its first such batch ("position 63 is beyond max_positions 63") with a traceback."""
    from test_cli import tf

    length = max_positions - 1
    src, tgt = " ".join(["y"] * length), " ".join(["a"] * length)
    assert [len(ids) for ids in tiny_tokenizer.encode_tgt([src, tgt])] == [length, length]
    prefix = tmp_path / "long"
    for lang, line in (("es", src), ("en", tgt)):
        Path(f"{prefix}.{lang}").write_text(f"{line}\n" * 16)
    settings_ = [
        f"data.train={prefix}",
        f"data.dev={prefix}",
        f"data.tokenizer={tiny_tokenizer.model_paths()[0].parent}",
        "data.clean=false",  # the same pair 16 times
        f"data.max_len={length}",
        f"data.pad_multiple={multiple}",
        f"model.max_positions={max_positions}",
        "train.max_steps=2",
        "train.eval_every=2",
        "train.eval_bleu_sentences=1",
    ]
    run = tmp_path / "run"
    result = tf("train", "tiny", "--out", run, *[a for s in settings_ for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "last.pt").is_file()
