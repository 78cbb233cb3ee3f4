"""Session 8 review of the evaluation stage: each test pins a defect found and fixed in this review."""

from __future__ import annotations

import pytest

from toolschool.evaluate.benchmarks import bfcl


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_bfcl_category_reads_its_own_data_file(category: str) -> None:
    # `BFCL_v*_multiple.json` also matched parallel_multiple (and live_*): "multiple" was parallel_multiple's data,
    # "irrelevance" was live_irrelevance's.
    items = bfcl.load_items(f"bfcl:{category}", limit=3)
    assert [item.id.rsplit("_", 1)[0] for item in items] == [category] * 3
    if category != "irrelevance":
        assert all(item.meta["ground_truth"] for item in items)
