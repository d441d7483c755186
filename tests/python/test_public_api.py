"""The public C++ API is small: public headers name no internal type, libopreg exports only what
OPREG_API marks (hidden visibility), and the version macros exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import opreg
from conftest import REPO

PUBLIC_HEADERS = sorted(
    p for p in (REPO / "include" / "opreg").glob("*.h*") if p.parent.name != "detail"
)


def test_there_are_public_headers():
    assert {"op.h", "definition.h", "registry.h", "triton.h"} <= {p.name for p in PUBLIC_HEADERS}


@pytest.mark.parametrize("header", PUBLIC_HEADERS, ids=lambda p: p.name)
def test_a_public_header_names_no_internal_type(header: Path):
    # Types are CamelCase; detail:: functions called from templates (trace records, the typed
    # kernel factories) are allowed, and so are friends (OpBuilder's Python front), which give
    # users nothing to use.
    text = header.read_text()
    named = [line for line in text.splitlines() if not line.strip().startswith("friend")]
    assert not re.findall(r"\bdetail::[A-Z]\w*", "\n".join(named)), header.name
    assert '#include "opreg/check.h"' not in text


def test_the_version_macros_exist():
    version = (REPO / "include" / "opreg" / "version.h.in").read_text()
    for macro in ("OPREG_VERSION_MAJOR", "OPREG_VERSION_MINOR", "OPREG_VERSION_PATCH"):
        assert f"#define {macro}" in version
    assert opreg.__version__.count(".") == 2


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_libopreg_exports_only_its_api():
    library = Path(opreg.__file__).parent / "lib" / "libopreg.so"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", "-C", str(library)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    opreg_symbols = [line for line in symbols.splitlines() if " opreg::" in line]
    assert any("opreg::OpBuilder::define" in line for line in opreg_symbols)
    assert any("opreg::triton::aot" in line for line in opreg_symbols)
    for internal in ("Trampoline", "CheckedFallback", "registry()", "build(", "publish("):
        assert not [line for line in opreg_symbols if internal in line], internal
