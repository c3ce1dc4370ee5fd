"""The per-form products file (kestrel_trio._kernels.portable.products) is what its generator makes from the
template and the forms' homes, and refuses to load once a source changed without regenerating it: numba checks a
cached function's own file only, so a stale products.py would keep running the old loops from its cache."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from kestrel_trio._kernels.portable.forms import generate, stamp, template  # noqa: E402

# A fresh interpreter importing numba and the products on a loaded 2-core machine (seconds; generous).
IMPORT_SECONDS = 300


def _committed_digest() -> str:
    from kestrel_trio._kernels.portable import products

    return products.SOURCES_DIGEST


def test_the_committed_products_file_is_what_the_generator_makes_now():
    committed = stamp.PRODUCTS.read_text(encoding="utf-8")
    assert committed == generate.render(), f"products.py is stale: run {stamp.COMMAND}"


def test_the_digest_covers_the_template_the_generator_and_every_home():
    names = [path.name for path in stamp.sources()]
    homes = {f"{form.home}.py" for form in template.FORMS}
    assert homes | {"dots.py", "bits.py", "template.py", "generate.py", "stamp.py"} <= set(names), names
    assert _committed_digest() == stamp.sources_digest()


def _copy_of_sources(tmp_path: Path) -> Path:
    room = tmp_path / "forms"
    room.mkdir()
    for path in stamp.sources():
        shutil.copyfile(path, room / path.name)
    return room


@pytest.mark.parametrize("changed", ["q8_0.py", "dots.py", "template.py"])
def test_a_source_changed_without_regenerating_is_refused_with_the_command(tmp_path: Path, changed: str):
    root = _copy_of_sources(tmp_path)
    stamp.require_current(_committed_digest(), root)  # the copy, unchanged: current
    with (root / changed).open("a", encoding="utf-8") as source:
        source.write("\n# an edit after products.py was generated\n")
    with pytest.raises(stamp.StaleProducts, match=r"python -m kestrel_trio\._kernels\.portable\.forms\.generate"):
        stamp.require_current(_committed_digest(), root)


def test_a_new_home_is_a_source_too(tmp_path: Path):
    root = _copy_of_sources(tmp_path)
    (root / "q2_k.py").write_text('"""A home added after products.py was generated."""\n', encoding="utf-8")
    with pytest.raises(stamp.StaleProducts):
        stamp.require_current(_committed_digest(), root)


def test_loading_the_kernels_raises_on_a_stale_products_file_rather_than_running_without_them():
    # loaded.ready() reports an import error as "numba cannot be imported" and runs the numpy path; a stale
    # products.py must stop instead. The digest is planted in a fresh interpreter, not in this one's loaded modules.
    script = ("from kestrel_trio._kernels.portable.forms import stamp\n"
              "stamp.sources_digest = lambda room=stamp.FORMS_ROOM: '0' * 64\n"
              "from kestrel_trio._kernels import loaded\n"
              "loaded.ready()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=IMPORT_SECONDS,
                            check=False)
    assert result.returncode != 0
    assert "StaleProducts" in result.stderr and stamp.COMMAND in result.stderr, result.stderr


def test_each_form_has_its_own_module_level_product_and_expansion():
    from kestrel_trio._kernels.portable import products

    assert products.FORMS == {form.name for form in template.FORMS}
    for form in template.FORMS:
        product, expand, *_ = products._PRODUCTS[form.name]
        # numba caches a function by its own module's file: each is products.py's, named for its form.
        assert (product.__module__, product.__name__) == (products.__name__, f"product_{form.suffix}")
        assert (expand.__module__, expand.__name__) == (products.__name__, f"expand_{form.suffix}")


def test_the_block_forms_weights_an_item_are_the_ggml_geometry():
    from kestrel_trio._kernels.portable import products
    from kestrel_trio._model.forms.dequant import GGML_TYPE_BY_NAME

    for name, ggml in GGML_TYPE_BY_NAME.items():
        if ggml.block_size > 1:
            assert products.COLUMNS_PER_ITEM[name] == ggml.block_size / ggml.type_size, name
