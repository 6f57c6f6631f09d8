"""N-gram storages: exact predictions on hand-written token streams, and the drafter."""

import pytest
import torch

from ngram_assisted import NGramDrafter, NGramStorage, OneLevelNGramStorage
from ngram_assisted.storage import FILLER_WEIGHT


def test_basic_predicts_from_longest_known_context():
    s = NGramStorage(3, 20)
    s.initialize([1, 2, 3, 1, 2, 4, 1, 2, 4, 5, 2, 9])
    assert s.next_token([1, 2]) == (4, True)       # trigram (1,2)->4 seen twice, ->3 once
    # (7,2) unknown as a trigram context; falls back to the bigram context (2,):
    # 2 -> 3 once, 4 twice, 9 once.
    assert s.next_token([7, 2]) == (4, True)
    assert s.next_token([4]) == (1, True)          # 4 -> 1 once, 4 -> 5 once: first to count wins
    assert s.next_token([6])[1] is False           # never seen at all


def test_bigram_storage_predicts_from_one_previous_token():
    s = NGramStorage(2, 10)
    s.initialize([1, 2, 1, 3, 1, 3])
    assert s.next_token([5, 1]) == (3, True)
    assert s.next_token([2]) == (1, True)


def test_one_level_only_uses_full_contexts():
    s = OneLevelNGramStorage(3, 20)
    s.initialize([1, 2, 3, 5, 2, 9])
    assert s.next_token([1, 2]) == (3, True)
    token, known = s.next_token([7, 2])            # only (2,) would match: not counted here
    assert known is False
    assert token == 2                               # fallback: most frequent token seen
    assert s.next_token([2]) == (2, False)          # context shorter than n-1


def test_update_continues_from_context_tail():
    s = NGramStorage(3, 20)
    s.initialize([1, 2])
    s.update([1, 2], [3])
    assert s.next_token([1, 2]) == (3, True)
    s.update([8, 1, 2], [4, 4])                     # (1,2)->4 and (2,4)->4
    assert s.next_token([2, 4]) == (4, True)
    assert s.next_token([1, 2]) == (3, True)        # tie 1:1 keeps the first


def test_filler_never_outweighs_an_observation_and_ranks_decay():
    s = NGramStorage(2, 20)
    s.update([5], [6])
    s.fill([5], [7, 8])
    assert s.next_token([5]) == (6, True)
    s.fill([9], [3, 4])                              # unseen context learns the top candidate
    assert s.next_token([9]) == (3, True)
    assert FILLER_WEIGHT < 1.0


def test_reset_forgets_everything():
    s = OneLevelNGramStorage(2, 10)
    s.initialize([1, 2, 1, 2])
    assert len(s) == 2
    s.reset()
    assert len(s) == 0 and s.next_token([1]) == (0, False)


@pytest.mark.parametrize("cls", [NGramStorage, OneLevelNGramStorage])
def test_invalid_arguments(cls):
    with pytest.raises(ValueError, match="n must be"):
        cls(1, 10)
    with pytest.raises(ValueError, match="vocab_size"):
        cls(3, 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cls(3, 10).initialize([1, 2, 10])


def test_drafter_follows_storage_and_stops_at_unknown():
    storage = NGramStorage(3, 20)
    drafter = NGramDrafter(storage, stop_if_unknown=True)
    drafter.begin([1, 2, 3, 4, 1, 2])
    draft, q = drafter.propose(torch.tensor([[0]]), 8)
    assert q is None
    # (1,2)->3, (2,3)->4, (3,4)->1, (4,1)->2, (1,2)->3 ... cycles: 8 tokens.
    assert draft.tolist() == [3, 4, 1, 2, 3, 4, 1, 2]
    drafter.update([9], None)                        # the target put 9 after (1,2)
    draft, _ = drafter.propose(torch.tensor([[0]]), 4)
    assert draft.tolist() == []                      # (2,9) and (9,) unknown: no drafts


def test_drafter_without_stop_pads_with_fallback():
    drafter = NGramDrafter(NGramStorage(2, 20), stop_if_unknown=False, confident_start=False)
    drafter.begin([5, 5, 6])
    # 6 unknown -> fallback 5 (most frequent); then 5 -> 5 and 5 -> 6 tie: first counted wins.
    assert drafter.propose(torch.tensor([[0]]), 3)[0].tolist() == [5, 5, 5]


def test_drafter_fills_target_top_k_at_each_position():
    storage = NGramStorage(2, 20)
    drafter = NGramDrafter(storage, filler_top_k=2)
    assert drafter.wants_top_k == 2
    drafter.begin([1])
    # Round appended [2, 3]; the target's top-2 after 1 was (2, 7), after 2 was (3, 8).
    drafter.update([2, 3], [[2, 7], [3, 8]])
    assert drafter.history == [1, 2, 3]
    assert storage.next_token([1]) == (2, True)
    storage.update([4], [5])
    assert storage.next_token([3])[1] is False       # no row was given for the position after 3
    assert NGramDrafter(storage, filler_top_k=1).wants_top_k == 0


def test_min_context_ignores_shorter_tails():
    s = NGramStorage(3, 20)
    s.initialize([1, 2, 3, 7, 2, 4])
    assert s.next_token([9, 2]) == (3, True)                    # backs off to (2,)
    assert s.next_token([9, 2], min_context=2)[1] is False     # (9, 2) itself unknown
    assert s.next_token([1, 2], min_context=2) == (3, True)


def test_confident_start_needs_a_full_context_for_the_first_draft():
    storage = NGramStorage(3, 20)
    storage.initialize([1, 2, 3, 4, 9, 2])
    ids = torch.tensor([[0]])
    confident = NGramDrafter(storage, confident_start=True)
    confident.begin([8, 2])                                    # (8, 2) unknown, (2,) known
    assert confident.propose(ids, 3)[0].tolist() == []
    eager = NGramDrafter(NGramStorage(3, 20), confident_start=False)
    eager.begin([1, 2, 3, 4, 9, 2])
    eager.history = [8, 2]
    assert eager.propose(ids, 3)[0].tolist() == [3, 4, 9]     # backed off, then full contexts
