"""The one encoding of both streams (`biprm.data.encoding`): L2R is prompt + s_1..s_T, R2L is prompt + s_T..s_1."""

import numpy as np

from biprm.data.encoding import Encoded, stream_order, tag_ends

ENC = Encoded(prompt=[1, 2], steps=[[3, 9], [4, 5, 9], [6, 9]], labels=None)


def test_each_stream_reads_the_prompt_then_the_steps_in_its_order():
    assert ENC.stream("l2r") == [1, 2, 3, 9, 4, 5, 9, 6, 9]
    assert ENC.stream("r2l") == [1, 2, 6, 9, 4, 5, 9, 3, 9]
    assert ENC.continuation("r2l") == ENC.stream("r2l")[2:]


def test_tag_ends_point_at_each_steps_tag_in_forward_step_order():
    for stream in ("l2r", "r2l"):
        row = ENC.stream(stream)
        ends = tag_ends([len(s) for s in ENC.steps], stream, start=len(ENC.prompt))
        assert [row[e] for e in ends] == [9, 9, 9]
        # the tag of step t closes the tokens of step t, whatever the stream's order
        assert [row[e - len(s) + 1 : e + 1] for e, s in zip(ends, ENC.steps)] == ENC.steps
    assert tag_ends([2, 3, 2], "r2l").tolist() == [6, 4, 1]


def test_the_reversal_is_its_own_inverse():
    outputs = np.array([[0.1], [0.2], [0.3]])  # per step, in R2L's order
    assert stream_order(outputs, "r2l").tolist() == [[0.3], [0.2], [0.1]]  # step 1 first
    assert stream_order(stream_order(outputs, "r2l"), "r2l").tolist() == outputs.tolist()
    assert stream_order(outputs, "l2r") is outputs
