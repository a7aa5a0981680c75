"""How every magic reads its line: shell quoting, ``-h``, no abbreviations, one-line mistakes."""

from __future__ import annotations

import shlex
from pathlib import Path

import nbformat
import pytest
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError
from kernels import execute, outputs

from ipycloud.magics._arguments import _words
from ipycloud.runtime.checkpoint import CheckpointManager
from ipycloud.runtime.guard.guard import session_guard

# A folder name with spaces, both quote characters, a backslash and a dollar sign.
AWKWARD = """my "best" run's ckpts \\ $HOME"""
MAGICS = ("checkpoint", "mount_storage", "dashboard", "keepalive", "gpuinfo")


@pytest.fixture
def notebook(shell):
    shell.run_cell("import torch\nmodel = torch.nn.Linear(3, 2)")
    return shell


def test_quoted_and_escaped_words_reach_the_magic_as_a_shell_gives_them(notebook,
                                                                        tmp_path: Path) -> None:
    folder = tmp_path / AWKWARD
    info = notebook.run_line_magic("checkpoint",
                                   f"save model --dir {shlex.quote(str(folder))} --tag \"x\"")
    assert info.directory == folder and info.tag == "x"
    assert [path.name for path in tmp_path.iterdir()] == [AWKWARD]
    spaced = tmp_path / "my ckpts"
    notebook.run_line_magic("checkpoint", f'save model --dir "{spaced}"')
    notebook.run_line_magic("checkpoint", f"save model --dir {tmp_path}/my\\ ckpts --step 7")
    assert [info.step for info in CheckpointManager(spaced).list()] == [0, 7]
    table = notebook.run_line_magic("checkpoint", f"list --dir '{spaced}'")
    assert str(table).splitlines()[0] == f"2 checkpoints in {spaced}"


def test_ipython_expands_variables_before_the_line_is_split(notebook, tmp_path: Path) -> None:
    notebook.user_ns["folder"] = str(tmp_path / "runs of today")
    result = notebook.run_cell('%checkpoint save model --dir "$folder"')
    assert result.success, result.error_in_exec
    assert [info.step for info in CheckpointManager(tmp_path / "runs of today").list()] == [0]
    result = notebook.run_cell(
        "import shlex\n%checkpoint save model --dir {shlex.quote(folder)} --step 3")
    assert result.success, result.error_in_exec
    assert [info.step for info in CheckpointManager(tmp_path / "runs of today").list()] == [0, 3]


def test_a_sync_between_folders_with_spaces(shell, local_home: Path, tmp_path: Path) -> None:
    source, target = tmp_path / "my outputs", tmp_path / "kept 'here'"
    source.mkdir()
    (source / "a b.txt").write_text("x")
    report = shell.run_line_magic("mount_storage",
                                  f"sync {shlex.quote(str(source))} {shlex.quote(str(target))}")
    assert report.copied == ("a b.txt",)
    assert (target / "a b.txt").read_text() == "x"


@pytest.mark.parametrize(
    ("magic", "line", "message"),
    [
        ("checkpoint", 'save model --dir ""', "argument --dir: empty value: give one or leave "
                                              "--dir out"),
        ("checkpoint", "save model --dir=", "argument --dir: empty value"),
        ("checkpoint", "save model --tag ''", "argument --tag: empty value"),
        ("checkpoint", 'save "" model', "empty argument (\"\" or ''): give a word or leave it "
                                        "out"),
        ("mount_storage", 'sync "" {tmp}/dst', "empty argument"),
        ("mount_storage", 'download http://x/y --dest ""', "argument --dest: empty value"),
        ("dashboard", "report --csv ''", "argument --csv: empty value"),
        ("keepalive", 'start --limit ""', "argument --limit: empty value"),
    ],
)
def test_empty_values_are_refused(notebook, tmp_path: Path, magic, line, message) -> None:
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic(magic, line.format(tmp=tmp_path))
    text = str(caught.value)
    assert text.startswith(f"%{magic}: {message}") and "\n" not in text
    assert text.endswith(f" (see %{magic}? for usage)")
    assert list(tmp_path.iterdir()) == []
    assert not session_guard().running


@pytest.mark.parametrize("magic", MAGICS)
@pytest.mark.parametrize(("line", "reason"), [
    ('list --dir "unclosed', "No closing quotation"),
    ("list --dir 'unclosed", "No closing quotation"),
    ("list --dir trailing\\", "a backslash at the end of the line escapes nothing"),
])
def test_unbalanced_quotes_are_one_line(shell, magic, line, reason) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic(magic, line)
    assert str(caught.value) == f"%{magic}: {reason} (see %{magic}? for usage)"


@pytest.mark.parametrize(("magic", "line"), [
    ("checkpoint", "save model --dir {tmp}/never -h"),
    ("checkpoint", "--help"),
    ("mount_storage", "sync {tmp}/a {tmp}/b --help"),
    ("dashboard", "-h"),
    ("keepalive", "start -h"),
    ("gpuinfo", "--json -h"),
])
def test_help_option_prints_the_help_page_and_does_nothing(notebook, tmp_path: Path, capsys,
                                                           magic, line) -> None:
    (tmp_path / "a").mkdir()
    result = notebook.run_line_magic(magic, line.format(tmp=tmp_path))
    page = capsys.readouterr().out
    assert result is None
    assert page.startswith(f"usage: %{magic} ")
    assert "-h, --help" in page and "Examples" in page
    help_page = notebook.find_line_magic(magic).__doc__  # what %name? shows
    assert page.strip() in help_page.replace("::\n\n  ", "usage: ", 1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a"]  # nothing created
    assert not session_guard().running


@pytest.mark.parametrize(("magic", "line", "option"), [
    ("gpuinfo", "--jso", "--jso"),
    ("checkpoint", "list --di /tmp", "--di"),
    ("mount_storage", "sync a b --del", "--del"),
    ("dashboard", "report --js", "--js"),
    ("keepalive", "start --int 5m", "--int"),
    ("keepalive", "--evry 5m", "--evry"),  # not "invalid choice: '5m'"
    ("keepalive", "--evry=5m", "--evry"),
    ("checkpoint", "save model -dir /tmp", "-dir"),
    ("notify", "add --url ntfy://ntfy.sh/x", "--url"),
    ("dashboard", "--interval 1 --hist 5m", "--hist"),
    ("gpuinfo", "-px", "-px"),
    ("dashboard", "'--bad\nline'", "'--bad\\nline'"),  # a word with a newline: one line
])
def test_an_unknown_or_abbreviated_option_is_named_in_one_line(shell, config_home: Path, magic,
                                                               line, option) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic(magic, line)
    assert str(caught.value) == f"%{magic}: unknown option {option} (see %{magic}? for usage)"
    assert not session_guard().running
    assert not config_home.exists()


def test_a_word_with_a_newline_is_named_in_one_line(shell) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("gpuinfo", "'extra\nword'")
    assert str(caught.value) == ("%gpuinfo: unrecognized arguments: extra\\nword "
                                 "(see %gpuinfo? for usage)")


def test_a_comment_after_the_magic_is_dropped_as_a_shell_drops_it(notebook,
                                                                 tmp_path: Path) -> None:
    result = notebook.run_cell(f"%checkpoint save model --dir {tmp_path}/a  # the first one")
    assert result.success, result.error_in_exec
    assert [info.step for info in CheckpointManager(tmp_path / "a").list()] == [0]
    # A # inside a word, in quotes or after a backslash is part of the word, as in a shell.
    result = notebook.run_cell(f"%checkpoint save model --dir {tmp_path}/run#2 --step 2 #done")
    assert result.success, result.error_in_exec
    assert [info.step for info in CheckpointManager(tmp_path / "run#2").list()] == [2]
    notebook.run_line_magic("checkpoint", f"save model --dir '{tmp_path}/kept # 4' --step 4")
    assert [info.step for info in CheckpointManager(tmp_path / "kept # 4").list()] == [4]
    notebook.run_line_magic("checkpoint", f"save model --dir {tmp_path}/\\#3 # it's the third")
    assert [info.step for info in CheckpointManager(tmp_path / "#3").list()] == [0]
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", 'list --dir "#unclosed # not a comment')
    assert "No closing quotation" in str(caught.value)


@given(st.lists(st.text(min_size=1)), st.text().map(lambda text: text.replace("\n", " ")))
def test_any_words_quoted_as_a_shell_quotes_them_survive_a_comment(words: list[str],
                                                                    comment: str) -> None:
    assert _words(f"{shlex.join(words)} #{comment}") == words


def test_words_that_start_with_a_dash_but_are_values_or_operands_reach_the_magic(
        notebook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    notebook.run_line_magic("checkpoint", "save model --dir -my-runs")  # a value
    assert [info.step for info in CheckpointManager(tmp_path / "-my-runs").list()] == [0]
    (tmp_path / "-from").mkdir()
    (tmp_path / "-from" / "a.txt").write_text("x")
    notebook.run_line_magic("mount_storage", "sync -- -from -to")  # operands after --
    assert (tmp_path / "-to" / "a.txt").read_text() == "x"


def test_quoting_help_and_mistakes_in_a_real_kernel(tmp_path: Path) -> None:
    folder = tmp_path / AWKWARD
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext ipycloud\nimport torch\nmodel = torch.nn.Linear(3, 2)",
        f"%checkpoint save model --dir {shlex.quote(str(folder))} --tag 'first'",
        f"folder = {str(tmp_path / 'with spaces')!r}\n"
        '%checkpoint save model --dir "$folder" --step 5',
        f"%checkpoint list --dir {shlex.quote(str(folder))}",
        "%checkpoint restore model -h",
        "%checkpoint list --step 5",
        "%checkpoint save model --step 1 --step 2",
        f"%checkpoint list --dir {shlex.quote(str(tmp_path / ('x' * 300)))}",
    )]
    for cell in notebook.cells[5:]:
        cell.metadata["tags"] = ["raises-exception"]
    cells = execute(notebook, tmp_path).cells
    assert sorted(path.name for path in tmp_path.iterdir()) == [AWKWARD, "with spaces"]
    assert CheckpointManager(folder).list()[0].tag == "first"
    assert [info.step for info in CheckpointManager(tmp_path / "with spaces").list()] == [5]
    listed = str(outputs(cells[3])["text/plain"])
    assert listed.splitlines()[0] == f"1 checkpoint in {folder}"
    assert outputs(cells[4])["stdout"].startswith("usage: %checkpoint ")
    assert outputs(cells[5]) == {"stderr": "UsageError: %checkpoint: --step does not apply to "
                                           "list (see %checkpoint? for usage)\n"}
    assert outputs(cells[6]) == {"stderr": "UsageError: %checkpoint: argument --step: given "
                                           "twice: give it once (see %checkpoint? for usage)\n"}
    assert outputs(cells[7]) == {"stderr": "UsageError: %checkpoint list: cannot use the "
                                           f"folder {tmp_path / ('x' * 300)}: a name in its "
                                           "path is too long for its file system; give a "
                                           "shorter one with --dir\n"}



@pytest.mark.parametrize(("magic", "line", "option"), [
    ("checkpoint", "save model --step 1 --step 2 --dir {tmp}/c", "--step"),
    ("checkpoint", "save model --tag x --tag y --dir {tmp}/c", "--tag"),
    ("checkpoint", "save model --dir {tmp}/a --dir={tmp}/b", "--dir"),
    ("checkpoint", "save model --async --dir {tmp}/c --async", "--async"),
    ("mount_storage", "sync {tmp}/a {tmp}/b --every 1m --every 2m", "--every"),
    ("mount_storage", "local --project x --project y", "--project"),
    ("dashboard", "report --csv {tmp}/a.csv --csv {tmp}/b.csv", "--csv"),
    ("dashboard", "--text --text", "--text"),
    ("keepalive", "start --limit 1h --limit 2h", "--limit"),
    ("gpuinfo", "--json --json", "--json"),
    ("gpuinfo", "-p --processes", "-p/--processes"),
    ("gpuinfo", "-pp", "-p/--processes"),
])
def test_an_option_given_twice_is_refused(notebook, local_home: Path, magic, line,
                                          option) -> None:
    before = sorted(local_home.parent.iterdir())
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic(magic, line.format(tmp=local_home.parent))
    assert str(caught.value) == (f"%{magic}: argument {option}: given twice: give it once "
                                 f"(see %{magic}? for usage)")
    assert sorted(local_home.parent.iterdir()) == before  # nothing made
    assert not session_guard().running


def test_a_leading_tilde_is_the_home_folder(shell, local_home: Path) -> None:
    (local_home / "outputs").mkdir(parents=True)
    (local_home / "outputs" / "a.txt").write_text("x")
    report = shell.run_line_magic("mount_storage", "sync ~/outputs ~/kept")
    assert report.copied == ("a.txt",)
    assert (local_home / "kept" / "a.txt").read_text() == "x"


@pytest.mark.parametrize(("magic", "line", "argument"), [
    ("checkpoint", "save model --dir ~nobody-here/ckpt", "argument --dir"),
    ("checkpoint", "list --dir ~nobody-here", "argument --dir"),
    ("mount_storage", "kaggle alice/iris --dest ~nobody-here/data", "argument --dest"),
    ("mount_storage", "download http://127.0.0.1:9/x --dest ~nobody-here", "argument --dest"),
    ("mount_storage", "sync {tmp} ~nobody-here/kept", "sync"),
    ("dashboard", "report --csv ~nobody-here/u.csv", "argument --csv"),
])
def test_a_tilde_of_an_unknown_user_is_one_line(notebook, tmp_path: Path, magic, line,
                                                argument) -> None:
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic(magic, line.format(tmp=tmp_path))
    text = str(caught.value)
    assert text.startswith(f"%{magic}") and "\n" not in text
    assert (f"{argument}: no user named 'nobody-here' for ~nobody-here: give the full path"
            in text)
    assert list(tmp_path.iterdir()) == []


def test_a_warning_given_twice_is_refused(shell) -> None:
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("keepalive", "start --warn 15m,5m,900s")
    assert str(caught.value) == ("%keepalive: argument --warn: 15 min is given twice in "
                                 "'15m,5m,900s': give each once (see %keepalive? for usage)")
    assert not session_guard().running
