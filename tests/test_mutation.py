"""fp16lab.testing.mutation: the score arithmetic, the equivalents file, and each target's files."""

from __future__ import annotations

import math
import pathlib

import pytest

from fp16lab.testing import mutation

ROOT = pathlib.Path(__file__).resolve().parent.parent

DIFF = """--- fp16lab/bits.py
+++ fp16lab/bits.py
@@ -1,4 +1,4 @@
 def next_up(code):
-    return code + 1
+    return code + 2
"""


def test_every_target_names_files_that_exist():
    for target in mutation.TARGETS.values():
        assert (ROOT / target.source).is_file(), target.source
        for test in target.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), path
            if name:
                assert f"def {name}(" in (ROOT / path).read_text(), test
        for glob in target.functions:
            module = target.source[:-3].replace("/", ".")
            assert glob.startswith(module + ".x"), glob


def test_changed_lines_ignore_headers_context_and_spacing():
    assert mutation.changed_lines(DIFF) == "-return code + 1\n+return code + 2"
    assert mutation.changed_lines(DIFF.replace("    return", "  return")) == \
        mutation.changed_lines(DIFF)


def test_function_of_a_mutant_name():
    assert mutation.function_of("fp16lab.bits.x_next_up__mutmut_12") == "x_next_up"
    assert mutation.function_of("fp16lab.scaling.xǁDynamicLossScalerǁupdate__mutmut_3") == \
        "xǁDynamicLossScalerǁupdate"


def test_score_counts_timeouts_as_caught_and_leaves_equivalents_out():
    statuses = {"a": "killed", "b": "killed", "c": "timeout", "d": "survived", "e": "survived",
                "f": "no tests"}
    counts = mutation.summarize(statuses, equivalent={"e"})
    assert (counts["killed"], counts["survived"], counts["no tests"], counts["equivalent"]) == \
        (2, 2, 1, 1)
    assert counts["score"] == 3 / (3 + 2)  # caught 3; missed: d and f (e is equivalent)
    assert math.isnan(mutation.summarize({}, set())["score"])
    with pytest.raises(ValueError, match="status 'weird'; rerun that module"):
        mutation.summarize({"a": "weird"}, set())


def test_equivalents_file_is_read_and_checked(tmp_path):
    path = tmp_path / "eq.toml"
    path.write_text('[[equivalent]]\nmodule = "bits"\nfunction = "x_next_up"\n'
                    'change = """\n-    return code + 1\n+    return code + 2\n"""\n'
                    'reason = "the codes are the same"\n')
    eq = mutation.load_equivalents(path)
    assert eq == {("bits", "x_next_up", mutation.changed_lines(DIFF)): "the codes are the same"}
    path.write_text('[[equivalent]]\nmodule = "bits"\n')
    with pytest.raises(ValueError, match=r"lacks \['change', 'function', 'reason'\]"):
        mutation.load_equivalents(path)
    assert mutation.load_equivalents(tmp_path / "absent.toml") == {}


def test_the_committed_equivalents_file_is_well_formed():
    for (module, function, change), reason in mutation.load_equivalents().items():
        assert module in mutation.TARGETS and function.startswith("x") and reason
        assert change.startswith("-") and "\n+" in change or change.startswith("+")


def test_unknown_modules_are_refused(capsys):
    with pytest.raises(SystemExit):
        mutation.main(["nope"])
    assert "unknown module(s) ['nope']; choose from formats, bits" in capsys.readouterr().err
