"""fp16lab.testing.mutation: the score arithmetic, the equivalents file, and each target's files."""

from __future__ import annotations

import math
import pathlib

import pytest

from fp16lab.testing import mutation, mutation_scores, mutation_targets

ROOT = pathlib.Path(__file__).resolve().parent.parent

DIFF = """--- fp16lab/bits.py
+++ fp16lab/bits.py
@@ -1,4 +1,4 @@
 def next_up(code):
-    return code + 1
+    return code + 2
"""


def test_every_target_names_files_that_exist():
    for target in mutation_targets.TARGETS.values():
        assert (ROOT / target.source).is_file(), target.source
        assert target.tests, f"{target.name} maps to no test file"
        for test in target.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), f"{target.name}: {path}"
            if name:
                assert f"def {name}(" in (ROOT / path).read_text(), test


def test_every_module_of_the_package_is_mutated_or_left_out_with_a_reason():
    modules = {mutation_targets.module_name(p) or "fp16lab" for p in (ROOT / "fp16lab").rglob("*.py")}
    assert modules == set(mutation_targets.TARGETS) | set(mutation_targets.LEFT_OUT)
    assert not set(mutation_targets.TARGETS) & set(mutation_targets.LEFT_OUT)
    assert all(why.strip() for why in mutation_targets.LEFT_OUT.values())
    # the tables name only modules that exist, and an override is not left out as well
    assert set(mutation_targets.EXCLUDED) <= modules
    assert set(mutation_targets.OVERRIDES) <= set(mutation_targets.TARGETS)
    # the modules the issue names are mutated, not left out
    for name in ("fp8.scales", "fp8.linear", "waves", "alignment", "execution", "recipes",
                 "inputs.augment", "inputs.producers", "inputs.feeding", "telemetry",
                 "profile.record", "bits.patterns", "sweep.engine"):
        assert name in mutation_targets.TARGETS, name


def test_convention_maps_a_module_to_the_mirrored_test_file():
    assert mutation_targets.conventional_tests("inputs.feeding") == ("tests/test_inputs_feeding.py",)
    assert mutation_targets.conventional_tests("waves") == ("tests/test_waves.py",)
    assert mutation_targets.conventional_tests("fp8.scales") == ("tests/test_fp8.py",)  # the package's file
    assert mutation_targets.conventional_tests("nothing.like_this") == ()
    assert mutation_targets.TARGETS["bits.patterns"].tests[0] == "tests/test_bits.py"
    assert "tests/test_hostile.py" in mutation_targets.TARGETS["scaling.scalers"].tests
    assert mutation_targets.TARGETS["fp8.training"].tests == mutation_targets.OVERRIDES["fp8.training"]
    # tests written against a module's survivors join its tests
    for kills in (ROOT / "tests").glob("test_mutation_kills_*.py"):
        name = next(n for n in mutation_targets.TARGETS
                    if kills.name == f"test_mutation_kills_{n.replace('.', '_')}.py")
        assert f"tests/{kills.name}" in mutation_targets.TARGETS[name].tests


def test_changed_modules_names_targets_whose_files_differ_from_a_base(monkeypatch):
    outputs = {("merge-base", "HEAD", "origin/main"): None, ("merge-base", "HEAD", "main"): "abc",
               ("rev-parse", "HEAD"): "def",
               ("diff", "--name-only", "abc", "--"): "fp16lab/waves.py\ntests/test_fp8.py\nREADME.md",
               ("ls-files", "--others", "--exclude-standard"): "tests/test_inputs_feeding.py"}
    seen = []

    def fake_run(cmd, cwd, capture_output, text):
        seen.append(tuple(cmd[1:]))
        out = outputs.get(tuple(cmd[1:]))
        return type("R", (), {"returncode": 0 if out is not None else 1, "stdout": out or ""})()

    monkeypatch.setattr(mutation.subprocess, "run", fake_run)
    changed = mutation_targets.changed_modules()
    assert ("diff", "--name-only", "abc", "--") in seen  # the merge-base with main
    assert {"waves", "inputs.feeding", "fp8.scales", "fp8.linear"} <= set(changed)
    assert "formats" not in changed and all(n in mutation_targets.TARGETS for n in changed)


def test_only_reexporting_init_files_are_recognised(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text('"""Doc."""\nfrom .a import b\nimport os\n__all__ = ["b"]\n')
    assert mutation_targets.only_reexports(init)
    init.write_text('"""Doc."""\nfrom .a import b\ndef f():\n    return 1\n')
    assert not mutation_targets.only_reexports(init)


def test_results_are_cached_by_the_content_of_the_module_and_its_tests(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation, "BUILD", tmp_path / "build")
    monkeypatch.setattr(mutation, "mutmut_version", lambda: "3.8.1")
    (tmp_path / "fp16lab").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "fp16lab" / "m.py").write_text("def f():\n    return 1\n")
    (tmp_path / "tests" / "test_m.py").write_text("def test_f():\n    pass\n")
    (tmp_path / "tests" / "conftest.py").write_text("")
    target = mutation_targets.Target("m", "fp16lab/m.py", ("tests/test_m.py",))
    key = mutation.cache_key(target)
    assert mutation.state(target) == "stale"
    work = tmp_path / "build" / "m"
    work.mkdir(parents=True)
    (work / "key").write_text(key + "\n")
    assert mutation.state(target) == "partial"  # a run of this content that did not finish
    (work / "done").write_text("")
    assert mutation.state(target) == "done"
    assert mutation.run_target(target) == 0.0  # cached: nothing runs
    (tmp_path / "tests" / "test_m.py").write_text("def test_f():\n    assert True\n")
    assert mutation.cache_key(target) != key and mutation.state(target) == "stale"
    (tmp_path / "tests" / "test_m.py").write_text("def test_f():\n    pass\n")
    assert mutation.state(target) == "done"
    (tmp_path / "fp16lab" / "m.py").write_text("def f():\n    return 2\n")
    assert mutation.state(target) == "stale"


def test_changed_lines_ignore_headers_context_and_spacing():
    assert mutation_scores.changed_lines(DIFF) == "-return code + 1\n+return code + 2"
    assert mutation_scores.changed_lines(DIFF.replace("    return", "  return")) == \
        mutation_scores.changed_lines(DIFF)


def test_function_of_a_mutant_name():
    assert mutation_scores.function_of("fp16lab.bits.x_next_up__mutmut_12") == "x_next_up"
    assert mutation_scores.function_of("fp16lab.scaling.xǁDynamicLossScalerǁupdate__mutmut_3") == \
        "xǁDynamicLossScalerǁupdate"


def test_score_counts_timeouts_as_caught_and_leaves_equivalents_out():
    statuses = {"a": "killed", "b": "killed", "c": "timeout", "d": "survived", "e": "survived",
                "f": "no tests"}
    counts = mutation_scores.summarize(statuses, equivalent={"e"})
    assert (counts["killed"], counts["survived"], counts["no tests"], counts["equivalent"]) == \
        (2, 2, 1, 1)
    assert counts["score"] == 3 / (3 + 2)  # caught 3; missed: d and f (e is equivalent)
    assert math.isnan(mutation_scores.summarize({}, set())["score"])
    with pytest.raises(ValueError, match="status 'weird'; rerun that module"):
        mutation_scores.summarize({"a": "weird"}, set())


def test_equivalents_file_is_read_and_checked(tmp_path):
    path = tmp_path / "eq.toml"
    path.write_text('[[equivalent]]\nmodule = "bits"\nfunction = "x_next_up"\n'
                    'change = """\n-    return code + 1\n+    return code + 2\n"""\n'
                    'reason = "the codes are the same"\n')
    eq = mutation_scores.load_equivalents(path)
    assert eq == {("bits", "x_next_up", mutation_scores.changed_lines(DIFF)): "the codes are the same"}
    path.write_text('[[equivalent]]\nmodule = "bits"\n')
    with pytest.raises(ValueError, match=r"lacks \['change', 'function', 'reason'\]"):
        mutation_scores.load_equivalents(path)
    assert mutation_scores.load_equivalents(tmp_path / "absent.toml") == {}


def test_the_committed_equivalents_file_is_well_formed():
    for (module, function, change), reason in mutation_scores.load_equivalents(mutation.EQUIVALENT).items():
        assert module in mutation_targets.TARGETS and function.startswith("x") and reason
        assert change.startswith("-") and "\n+" in change or change.startswith("+")


def test_unknown_modules_are_refused(capsys):
    with pytest.raises(SystemExit):
        mutation.main(["nope"])
    assert "unknown module(s) ['nope']; choose from alignment, autocast_ops, bench" in capsys.readouterr().err


def _row(source, counts, seconds):
    return (f"| `{source}` | `test_x.py` | {sum(counts)} | " + " | ".join(map(str, counts))
            + f" | {counts[1]} | 100.0% | {seconds} | 1.00 |")


def test_a_module_without_results_here_keeps_its_row_and_survivors(tmp_path, monkeypatch):
    """The cache is per checkout, the report is committed: a report written where only some
    modules have results keeps the others' rows and survivor blocks, saying so."""
    n = len(mutation_scores.COLUMNS)
    a = [10, 2] + [0] * (n - 2)
    b = [5, 1, 1] + [0] * (n - 3)
    earlier = "\n".join([
        "# Mutation testing report", "", "| module | ... |", "| --- |",
        _row("fp16lab/bits/patterns.py", a, 42), _row("fp16lab/widgets/__init__.py", b, 7),
        "| **all** | |", "", "## Survivors", "",
        "### `fp16lab.bits.patterns.x_f__mutmut_1` (bits.patterns)", "", "equivalent: same", "",
        "```diff", "-a", "+b", "```", "",
        "### `fp16lab.widgets.x_g__mutmut_3` (widgets)", "", "**survived, not explained**", ""])
    path = tmp_path / "report.md"
    path.write_text(earlier + "\n")
    got = mutation.earlier_report(path)
    assert set(got) == {"bits.patterns", "widgets"}
    assert got["bits.patterns"][2]["killed"] == 10 and got["widgets"][2]["no tests"] == 1
    assert got["widgets"][1] == ["### `fp16lab.widgets.x_g__mutmut_3` (widgets)\n\n"
                                 "**survived, not explained**"]

    targets = {name: mutation_targets.Target(name, f"fp16lab/{p}", ("tests/test_x.py",))
               for name, p in (("bits.patterns", "bits/patterns.py"), ("widgets", "widgets/__init__.py"),
                               ("waves", "waves.py"))}
    monkeypatch.setattr(mutation, "TARGETS", targets)
    monkeypatch.setattr(mutation, "load_results", lambda target: {})
    monkeypatch.setattr(mutation, "_git_commit", lambda: "abc1234")
    monkeypatch.setattr(mutation, "mutmut_version", lambda: "3.8.1")  # CI installs no mutmut
    mutation.write_report(path)
    text = path.read_text()
    assert f"| 12 | 10 | 2 |" in text and f"| {mutation.CARRIED} | |" in text
    assert text.count(mutation.CARRIED) == 2
    assert "Modules not run yet (1): `waves`." in text
    assert "(bits.patterns)" in text and "(widgets)" in text  # their survivors kept
    assert "| **all** | | 19 | 15 | 3 | 1 |" in text


def test_a_module_with_no_mutant_checked_says_so_in_the_table():
    """A stopped run's next module has no score yet: the table says so, not 'nan%'."""
    from fp16lab.testing import mutation
    target = mutation.TARGETS["waves"]
    counts = {**{c: 0 for c in mutation.COLUMNS}, "equivalent": 0, "score": float("nan")}
    line = mutation._table_line(target, counts, "unfinished")
    assert "| no mutant checked yet | unfinished |" in line and "nan" not in line
    assert "| 50.0% |" in mutation._table_line(target, {**counts, "score": 0.5}, "12")
