"""The SRAM allocator's choice of lines, checked by hand (lpx_tvm/target/sram_alloc.py)."""

import numpy as np

from lpx_tvm import load_config
from lpx_tvm.target.program_image import ProgramImage
from lpx_tvm.target.sram_alloc import HOP_BUCKET, NEAR_LINES, SramAllocator
from lpx_tvm.target.sram_plan import SramPlan


def test_a_small_value_goes_to_the_slice_nearest_the_vxm():
    # hops // HOP_BUCKET (3): 13, 1, 0, 3 -> slice 2
    assert HOP_BUCKET == 3
    alloc = SramAllocator(4, 100, hops=[40, 5, 0, 9])
    assert alloc.alloc(1) == (2, 0)
    assert alloc.alloc(NEAR_LINES) == (2, 1)  # slice 2 stays the nearest; its mark rises to 5


def test_a_large_tile_ignores_distance():
    # More than NEAR_LINES lines: the lowest mark, then the least-used, then the lowest slice.
    alloc = SramAllocator(4, 100, hops=[40, 5, 0, 9])
    assert alloc.alloc(NEAR_LINES + 1) == (0, 0)
    assert alloc.alloc(NEAR_LINES + 1) == (1, 0)


def test_slices_within_a_bucket_count_as_equally_near():
    # hops 1 and 2 share bucket 0: the lower mark wins, then the lower slice
    alloc = SramAllocator(3, 100, hops=[7, 2, 1])
    assert alloc.alloc(1) == (1, 0)
    assert alloc.alloc(1) == (2, 0)  # slice 1's mark would rise to 2, slice 2's only to 1


def test_never_used_lines_are_not_recently_freed():
    # Slice 0 holds [0, 20) and frees [0, 10); slice 1 holds [0, 30). The next 10 lines must
    # not reuse the lines just freed (their reader may still be at work: a write there
    # would wait for it), while lines never used are free now: slice 0 at 20 (its mark
    # rises to 30, below slice 1's 40).
    alloc = SramAllocator(2, 100)
    assert alloc.alloc(10, slice=0) == (0, 0)
    assert alloc.alloc(10, slice=0) == (0, 10)
    assert alloc.alloc(30, slice=1) == (1, 0)
    alloc.free(0, 0, 10)
    assert alloc.alloc(10) == (0, 20)


def test_the_plan_measures_distance_on_the_floorplan():
    # tsp: MXM MXM SXM MEM*44 VXM MEM*44 SXM MXM MXM. Slices 42..45 are 1 or 2 hops from
    # the VXM (one bucket); the lowest of them takes the first small value.
    config = load_config("tsp")
    plan = SramPlan(config, ProgramImage(config))
    assert config.position("VXM") - config.position("MEM", 42) == 2
    assert plan.alloc_lines(1) == (42, 0)
    assert plan.alloc_lines(64) == (0, 0)



def test_a_tall_values_tiles_keep_apart_where_one_slice_would_take_them_all():
    # mini: 8 slices of 4,096 lines. Constants (weights) take the top 3,800 lines of
    # every slice but 5, so working space there soon raises its mark past half the room
    # under them, and the allocator puts each tile of 64 fp16 rows (128 lines) on slice 5,
    # where a product reading them a tile at a time would queue on its one read port.
    # ``tiles_apart`` keeps each tile off the slices of the tiles before it.
    config = load_config("mini")

    def plan_with_weights():
        plan = SramPlan(config, ProgramImage(config))
        for sl in set(range(config.mem_slices)) - {5}:
            plan.tensor(f"w{sl}", (3800, 16), "int8", data=np.zeros((3800, 16)), slices=[sl])
        return plan

    packed = plan_with_weights().tensor("x", (64, 64), "fp16")
    assert {sl for sl, _ in packed.layout.tiles} == {5}
    apart = plan_with_weights().tensor("x", (64, 64), "fp16", tiles_apart=True)
    slices = [sl for sl, _ in apart.layout.tiles]
    assert slices[0] == 5 and len(set(slices)) == 4, slices
