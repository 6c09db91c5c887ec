"""The greedy agreement rule: tokens must match while the reference's top-2 margin
exceeds the tolerance, and only then."""

from __future__ import annotations

import pytest
import torch

from tileops.testing.agreement import check_greedy_agreement, confident_steps


def logits(margins: list[list[float]], vocab: int = 4) -> torch.Tensor:
    """[steps, batch, vocab] whose argmax is token 0 with the given top-2 margins."""
    out = torch.zeros(len(margins), len(margins[0]), vocab)
    out[..., 0] = torch.tensor(margins)
    return out


def test_a_row_is_confident_until_its_first_margin_at_or_below_the_tolerance():
    ref = logits([[1.0, 1.0], [0.5, 0.1], [1.0, 1.0], [0.05, 1.0]])
    assert confident_steps(ref, tol=0.1) == [3, 1]


def test_tokens_that_differ_after_an_unsure_step_are_accepted():
    ref = logits([[1.0], [0.01], [1.0]])
    ref_tokens = torch.zeros(1, 3, dtype=torch.long)
    tokens = torch.tensor([[0, 2, 3]])  # goes apart at the unsure step and after it
    assert check_greedy_agreement(ref, ref_tokens, tokens, tol=0.1) == [1]


def test_a_token_that_differs_at_a_confident_step_fails_naming_row_and_step():
    ref = logits([[1.0, 1.0], [1.0, 1.0]])
    ref_tokens = torch.zeros(2, 2, dtype=torch.long)
    tokens = torch.tensor([[0, 0], [0, 1]])
    with pytest.raises(AssertionError, match="row 1: token 1 != reference 0 at step 1"):
        check_greedy_agreement(ref, ref_tokens, tokens, tol=0.1)


def test_shapes_that_do_not_line_up_are_refused():
    with pytest.raises(ValueError, match=r"\[batch, steps\]"):
        check_greedy_agreement(
            logits([[1.0]]), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), 0.1
        )
