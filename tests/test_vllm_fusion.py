"""The plugin's split of the heads (each stream's rows, then the fusion) equals BiPRMModel.heads; no vLLM needed."""

import numpy as np
import pytest
import torch

from biprm.modeling import BiPRMModel
from biprm.config import MODE_TABLE
from biprm.data.encoding import Encoded
from biprm.vllm_plugin.fusion import at_step_ends, fuse, stream_rows


@pytest.mark.parametrize("mode", ["bi", "bi-static", "l2r", "r2l"])
def test_rows_then_fusion_equal_the_models_heads(bi_scorer, mode):
    config = bi_scorer.model.config.__class__(**{**bi_scorer.model.config.to_dict(), "mode": mode})
    torch.manual_seed(1)
    model = BiPRMModel(config, backbone=bi_scorer.model.backbone).eval()
    T, H = 5, config.backbone_config.hidden_size
    h = {"l2r": torch.randn(T, H), "r2l": torch.randn(T, H)}  # forward step order
    with torch.no_grad():
        want = model.heads(
            *(h[s] if s in MODE_TABLE[mode].streams else None for s in ("l2r", "r2l")), torch.tensor([0, T])
        )
        in_stream_order = {
            s: h[s] if s == "l2r" else h[s].flip(0) for s in MODE_TABLE[mode].streams
        }  # as each stream's prompt holds its steps
        rows = {s: stream_rows(x, model.value_head, model.gate).double().numpy() for s, x in in_stream_order.items()}
    gate = model.gate
    w2, b2 = (gate[2].weight.detach().double().numpy()[0], float(gate[2].bias)) if gate is not None else (None, 0.0)
    got = fuse(rows, mode, w2, b2)
    for key in ("fused", "l2r", "r2l", "sigma"):
        expected = getattr(want, key)
        assert (got[key] is None) == (expected is None), key
        if expected is not None:
            np.testing.assert_allclose(got[key], expected.double().numpy(), atol=1e-6, err_msg=key)


def test_sigmoid_takes_reversed_rows_of_any_length_without_overflow():
    """R2L rows come back reversed (a negative stride): one step, many steps, and extreme logits."""
    from biprm.vllm_plugin.fusion import sigmoid

    for x in (np.array([1.39531755])[::-1], np.array([-800.0, -2.0, 0.0, 3.0, 800.0])[::-1]):
        want = np.array([1 / (1 + np.exp(-v)) if v > -700 else 0.0 for v in x])
        assert np.allclose(sigmoid(x), want, rtol=1e-12, atol=0)


def test_rows_are_read_at_each_step_pieces_end_where_the_tag_is_ordinary_text():
    """A text tag (7 here, as Skywork's "\n") inside the question and a step is pooled too; only each piece's last token
    is a step tag, in the stream's order."""
    enc = Encoded(prompt=[1, 7, 2], steps=[[3, 7, 4, 7], [5, 7]], labels=None)
    for stream, ends in (("l2r", [6, 8]), ("r2l", [4, 8])):
        rows = np.flatnonzero(np.array(enc.stream(stream)) == 7)[:, None]  # the model's rows, each holding its position
        assert at_step_ends(rows, enc, stream, 7)[:, 0].tolist() == ends
    with pytest.raises(ValueError, match="pooled 3 rows where the l2r prompt holds 4 step-tag tokens"):
        at_step_ends(np.zeros((3, 1)), enc, "l2r", 7)
