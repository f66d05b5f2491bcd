"""The storage rules of whole-row data movement, with hand-computed answers."""

from lpx_tvm.target.codegen.rules import flattens_pixels, row_axis_problem, row_blocks


def test_row_axes_are_the_axes_before_the_last_of_ranks_2_and_3():
    assert row_axis_problem("concat", 0, 2) is None
    assert row_axis_problem("concat", -2, 3) is None
    assert row_axis_problem("concat", 0, 3) is None
    assert "moves lanes" in row_axis_problem("concat", -1, 3)
    assert "ranks 2 and 3" in row_axis_problem("strided_slice", 2, 4)
    assert "ranks 2 and 3" in row_axis_problem("strided_slice", 0, 1)


def test_row_blocks():
    # (2, 5, 7, 16): axis 1 repeats twice, one index spans 7 rows.
    assert row_blocks((2, 5, 7, 16), 1) == (2, 7)
    assert row_blocks((4, 9, 8), 0) == (1, 9)
    assert row_blocks((4, 9, 8), 1) == (4, 1)
    assert row_blocks((30, 20), 0) == (1, 1)


def test_flattens_pixels():
    assert flattens_pixels((1, 64, 4, 4), (1, 16, 64))
    assert flattens_pixels((2, 40, 5, 6), (2, 30, 40))
    assert not flattens_pixels((1, 64, 4, 4), (1, 64, 16))  # flatten(2) alone moves lanes
    assert not flattens_pixels((1, 16, 64), (1, 16, 64))
