"""``%checkpoint`` on a real IPython shell, with real torch objects and real files."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
from pathlib import Path

import pytest
import torch
from IPython.core.error import UsageError

from ipycloud.runtime.checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    CheckpointWarning,
    auto,
    manager_for,
)


@pytest.fixture
def notebook(shell, tmp_path: Path):
    """A shell with a model, an optimizer, a scheduler and a plain value defined."""
    shell.run_cell(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(8, 1))\n"
        "optimizer = torch.optim.Adam(model.parameters(), lr=0.01)\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)\n"
        "epoch = 3\n"
        "def train_step():\n"
        "    optimizer.zero_grad()\n"
        "    model(torch.randn(16, 4)).pow(2).mean().backward()\n"
        "    optimizer.step(); scheduler.step()\n"
        "train_step()\n"
    )
    yield shell
    auto.unregister()


def weights(shell) -> list[torch.Tensor]:
    return [tensor.clone() for tensor in shell.user_ns["model"].state_dict().values()]


def test_save_list_restore_round_trip(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    info = notebook.run_line_magic("checkpoint", f"save model optimizer scheduler epoch "
                                                 f"--dir {folder} --step 100")
    assert isinstance(info, CheckpointInfo) and info.step == 100
    saved = weights(notebook)
    saved_lr = notebook.user_ns["optimizer"].param_groups[0]["lr"]
    notebook.run_cell("train_step(); train_step(); epoch = 5")
    assert not torch.equal(weights(notebook)[0], saved[0])

    notice = notebook.run_line_magic("checkpoint", f"restore model optimizer scheduler epoch "
                                                   f"--dir {folder}")
    assert str(notice).startswith("restored model, optimizer, scheduler, epoch from checkpoint "
                                  "step-000000100")
    assert all(torch.equal(a, b) for a, b in zip(weights(notebook), saved, strict=True))
    assert notebook.user_ns["optimizer"].param_groups[0]["lr"] == saved_lr
    assert notebook.user_ns["epoch"] == 3

    table = notebook.run_line_magic("checkpoint", f"list --dir {folder}")
    text = str(table)
    assert text.splitlines()[0] == f"1 checkpoint in {folder}"
    assert "step-000000100 (latest)" in text
    assert "<table>" in table._repr_html_()


def test_steps_count_up_and_tags_and_steps_can_be_restored(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    first = notebook.run_line_magic("checkpoint", f"save model --dir {folder}")
    notebook.run_cell("train_step()")
    tagged = notebook.run_line_magic("checkpoint", f"save model --dir {folder} --tag warm")
    after_tag = weights(notebook)
    notebook.run_cell("train_step()")
    notebook.run_line_magic("checkpoint", f"save model --dir {folder}")
    assert (first.step, tagged.step) == (0, 1)
    notebook.run_line_magic("checkpoint", f"restore model --dir {folder} --from warm")
    assert all(torch.equal(a, b) for a, b in zip(weights(notebook), after_tag, strict=True))
    notebook.run_line_magic("checkpoint", f"restore model --dir {folder} --from 0")
    first_state = torch.load(first.data_path, weights_only=True)["state"]["model"]
    assert torch.equal(notebook.user_ns["model"][0].weight, first_state["0.weight"])


def test_async_save_returns_at_once_and_is_listed(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    notice = notebook.run_line_magic("checkpoint", f"save model optimizer --async --dir {folder}")
    assert "in the background" in str(notice)
    saved = weights(notebook)
    notebook.run_cell("train_step()")  # training goes on while the file is written
    table = notebook.run_line_magic("checkpoint", f"list --dir {folder}")
    assert [info.step for info in table.infos] == [0]
    stored = torch.load(table.infos[0].data_path, weights_only=True)["state"]["model"]
    assert all(torch.equal(a, b) for a, b in zip(stored.values(), saved, strict=True))


def test_configured_folder_is_used_without_dir(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "configured"
    notebook.run_line_magic("config", f"CheckpointMagics.directory = {str(folder)!r}")
    notebook.run_line_magic("checkpoint", "save model")
    assert [info.step for info in CheckpointManager(folder).list()] == [0]


def test_a_configured_folder_of_an_unknown_user_is_one_line(notebook) -> None:
    notebook.run_line_magic("config", "CheckpointMagics.directory = '~nobody-here/runs'")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", "save model")
    assert str(caught.value) == ("%checkpoint save: CheckpointMagics.directory: no user named "
                                 "'nobody-here' for ~nobody-here: give the full path")


@pytest.fixture
def plain_machine(tmp_path: Path, monkeypatch) -> Path:
    """A local machine whose home is tmp_path, with no notebook name known."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for variable in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "JUPYTERHUB_USER",
                     "BINDER_SERVICE_HOST", "JPY_SESSION_NAME"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path


def test_default_folder_is_under_the_platform_persistent_folder(notebook,
                                                                plain_machine: Path) -> None:
    info = notebook.run_line_magic("checkpoint", "save model")
    assert info.directory == plain_machine / "checkpoints" / "default"


def test_where_nothing_persists_the_warning_names_dir(notebook, plain_machine: Path,
                                                     monkeypatch) -> None:
    monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/example/repo")
    with pytest.warns(CheckpointWarning) as warned, contextlib.suppress(UsageError):
        notebook.run_line_magic("checkpoint", "list")  # reads; writes nothing
    assert str(warned[0].message) == ("nothing survives a Binder session: checkpoints go to "
                                      "/tmp; download them or pass --dir")


@pytest.mark.parametrize(("variable", "value", "folder"), [
    ("JPY_SESSION_NAME", "/home/me/my project/train v2.ipynb", "train v2"),
    ("JPY_SESSION_NAME", "Untitled.ipynb", "Untitled"),
    ("__vsc_ipynb_file__", "/work/eval.ipynb", "eval"),
    ("JPY_SESSION_NAME", "/home/me/.ipynb", "default"),
])
def test_the_default_folder_is_the_notebooks_own(notebook, plain_machine: Path, monkeypatch,
                                                 variable: str, value: str,
                                                 folder: str) -> None:
    if variable == "JPY_SESSION_NAME":  # set by Jupyter's server for a notebook's kernel
        monkeypatch.setenv(variable, value)
    else:  # VS Code puts it in the notebook's namespace
        notebook.user_ns[variable] = value
    info = notebook.run_line_magic("checkpoint", "save model")
    assert info.directory == plain_machine / "checkpoints" / folder


def test_auto_registers_and_saves_after_a_cell_when_due(notebook, tmp_path: Path,
                                                        capsys) -> None:
    folder = tmp_path / "auto"
    registration = notebook.run_line_magic("checkpoint",
                                           f"auto model optimizer --every 10m --dir {folder}")
    assert auto.registered() is registration
    assert str(registration).startswith("auto checkpoint of model, optimizer every 10 min")
    notebook.run_cell("train_step()")
    assert list(folder.iterdir()) == []  # made when registered, no save due yet
    registration.last_saved_at -= 601  # ten minutes pass
    notebook.run_cell("train_step()")
    assert "ipycloud: automatic checkpoint step-000000000" in capsys.readouterr().out
    saved = torch.load(CheckpointManager(folder).latest().data_path, weights_only=True)
    assert torch.equal(saved["state"]["model"]["0.weight"], notebook.user_ns["model"][0].weight)
    assert registration.save_now().step == 1  # what deadline and SIGTERM handlers call
    assert notebook.run_line_magic("checkpoint", "auto") is registration
    assert str(notebook.run_line_magic("checkpoint", "auto --off")) == (
        "automatic checkpoints stopped")
    assert auto.registered() is None


def test_an_auto_save_into_a_failing_folder_goes_to_the_fallback(notebook, tmp_path: Path,
                                                                 scratch: Path, capsys) -> None:
    folder = tmp_path / "auto"
    registration = notebook.run_line_magic("checkpoint", f"auto model --every 1s --dir {folder}")
    folder.rmdir()
    folder.write_text("a file where the folder was")
    registration.last_saved_at -= 2
    with pytest.warns(CheckpointWarning, match=rf"saving into {folder} failed: .*File exists; "
                                                r"step 0 is saved in .*ipycloud-fallback"):
        notebook.run_cell("x = 1")
    saved = registration.last_saved
    assert saved is not None and saved.directory.parent == scratch / "ipycloud-fallback"
    assert "ipycloud: automatic checkpoint step-000000000" in capsys.readouterr().out


def test_an_auto_save_that_goes_nowhere_is_shown_not_swallowed(
        notebook, tmp_path: Path, scratch: Path, capsys) -> None:
    folder = tmp_path / "auto"
    registration = notebook.run_line_magic("checkpoint", f"auto model --every 1s --dir {folder}")
    folder.rmdir()
    folder.write_text("a file where the folder was")
    (scratch / "ipycloud-fallback").write_text("and a file where the fallback goes")
    registration.last_saved_at -= 2
    with pytest.warns(CheckpointWarning, match="could not be saved in .* either"):
        notebook.run_cell("x = 1")
    assert ("ipycloud: automatic checkpoint failed: CheckpointStorageError: step 0 could not "
            f"be saved in {folder} or its fallback folder") in capsys.readouterr().out


def test_auto_uses_the_variable_bound_at_save_time(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "auto"
    registration = notebook.run_line_magic("checkpoint", f"auto model --every 1h --dir {folder}")
    notebook.run_cell("model = torch.nn.Linear(2, 2)")
    info = registration.save_now()
    stored = torch.load(info.data_path, weights_only=True)["state"]["model"]
    assert set(stored) == {"weight", "bias"} and stored["weight"].shape == (2, 2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "the following arguments are required: action"),
        ("bogus", "invalid choice: 'bogus'"),
        ("save", "name the variables, e.g. %checkpoint save model optimizer"),
        ("save modle", "no variable named 'modle' in the notebook"),
        ("save train_step", "'train_step' is a function without state_dict()"),
        ("save model --step x", "argument --step: invalid int value: 'x'"),
        ("save model --step -3", "argument --step: step must be from 0 to 999999999"),
        ("save model --step 1000000000", "step must be from 0 to 999999999 (checkpoint names "
                                         "hold nine digits), not 1000000000"),
        ("save model --tag 9lives", "invalid tag '9lives'"),
        ("save model --tag latest", "invalid tag 'latest'"),
        ("save model --unknown", "unknown option --unknown"),
        ("restore model --dir {tmp}/missing", "does not exist; save a checkpoint first"),
        ("restore model --dir {tmp}/empty", "no checkpoint in"),
        ("list --dir {tmp}/empty", "no checkpoint in"),
        ("list model", "%checkpoint list takes no variable names"),
        ("restore model --dir {tmp}/one --from 7", "no checkpoint of step 7"),
        ("restore model --dir {tmp}/one --from ²", "no checkpoint tagged or named '²'"),
        ("restore model --dir {tmp}/one --from best", "%checkpoint restore: --from best ranks "
                                                      "checkpoints by a metric, and no "
                                                      "checkpoint in "),
        ("restore model --dir {tmp}/one --best-by loss", "--best-by goes with --from best"),
        ("restore model --dir {tmp}/one --from best --best-by loss:up",
         "argument --best-by: give METRIC, METRIC:min or METRIC:max, not 'loss:up'"),
        ("restore model epoch --dir {tmp}/one", "the checkpoint has no 'epoch' (it holds "
                                                "'model'); pass --no-strict to restore the rest"),
        ("restore optimizer --dir {tmp}/one --from model", "no checkpoint tagged or named"),
        ("auto model --off", "%checkpoint auto --off takes no variable names (got model)"),
        ("auto --every 5m", "name the variables to save"),
        ("auto", "name the variables to save"),
        ("auto model --every soon", "'soon' is not a duration"),
        ("auto model --every -5m", "%checkpoint: argument --every: '-5m' is not a duration"),
        ("auto model --every 99999999999h", "%checkpoint: argument --every: '99999999999h' is "
                                            "longer than 30 days: give at most 30d"),
        ("auto nothing_here", "no variable named 'nothing_here'"),
    ],
)
def test_bad_lines_give_one_line_usage_errors(notebook, tmp_path: Path, line, message) -> None:
    (tmp_path / "empty").mkdir()
    CheckpointManager(tmp_path / "one").save({"model": notebook.user_ns["model"]}, 0)
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", line.format(tmp=tmp_path))
    text = str(caught.value)
    assert message in text
    assert text.startswith("%checkpoint") and "\n" not in text


def test_help_page_lists_every_action_with_examples(shell) -> None:
    doc = shell.find_line_magic("checkpoint").__doc__
    for example in ("%checkpoint save model optimizer --async", "%checkpoint list",
                    "%checkpoint restore model --from before-finetune",
                    "%checkpoint auto model optimizer --every 10m"):
        assert example in doc
    assert "{save,restore,list,auto}" in doc


def test_keep_last_defaults_to_the_runtimes_and_is_configurable(notebook, tmp_path: Path) -> None:
    magics = notebook.magics_manager.registry["CheckpointMagics"]
    assert magics.keep_last == 3
    notebook.run_line_magic("config", "CheckpointMagics.keep_last = 1")
    for step in (1, 2):
        notebook.run_line_magic("checkpoint", f"save model --step {step} --dir {tmp_path / 'k'}")
    assert [info.step for info in manager_for(tmp_path / "k").list()] == [2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("list --step 5", "--step does not apply to list"),
        ("list --tag x", "--tag does not apply to list"),
        ("list --no-strict", "--no-strict does not apply to list"),
        ("save model --from 3", "--from does not apply to save"),
        ("save model --every 5m", "--every does not apply to save"),
        ("save model --no-strict", "--no-strict does not apply to save"),
        ("restore model --async", "--async does not apply to restore"),
        ("restore model --step 2", "--step does not apply to restore"),
        ("auto model --tag x", "--tag does not apply to auto"),
        ("auto --off --every 5m", "--every does not apply to auto --off"),
        ("auto --off --dir {tmp}", "--dir does not apply to auto --off"),
    ],
)
def test_options_that_do_not_apply_to_the_action_are_refused(notebook, tmp_path: Path, line,
                                                             message) -> None:
    notebook.run_line_magic("checkpoint", f"save model --dir {tmp_path / 'one'}")
    registered = auto.registered()
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", line.format(tmp=tmp_path))
    assert str(caught.value) == f"%checkpoint: {message} (see %checkpoint? for usage)"
    assert [info.step for info in CheckpointManager(tmp_path / "one").list()] == [0]
    assert auto.registered() is registered  # nothing was done


def test_no_strict_restores_what_the_checkpoint_holds(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    notebook.run_line_magic("checkpoint", f"save model --dir {folder}")
    saved = weights(notebook)
    notebook.run_cell("train_step(); epoch = 9")
    notice = notebook.run_line_magic("checkpoint", f"restore model epoch --dir {folder} "
                                                   "--no-strict")
    assert str(notice).startswith("restored model from checkpoint step-000000000")
    assert str(notice).endswith("; not in it, left as they were: epoch")
    assert all(torch.equal(a, b) for a, b in zip(weights(notebook), saved, strict=True))
    assert notebook.user_ns["epoch"] == 9


def test_plain_values_come_back_into_the_notebook_even_when_not_defined(
        notebook, tmp_path: Path) -> None:
    folder = tmp_path / "my runs"
    notebook.run_cell("history = {'loss': [0.5, 0.25]}; seen = [1, 2]")
    notebook.run_line_magic("checkpoint", f"save model epoch history seen --dir '{folder}'")
    notebook.run_cell("del epoch, history, seen")
    notice = notebook.run_line_magic("checkpoint", f"restore epoch history seen --dir '{folder}'")
    assert str(notice).startswith("restored epoch, history, seen from checkpoint ")
    assert notebook.user_ns["epoch"] == 3
    assert notebook.user_ns["history"] == {"loss": [0.5, 0.25]}
    assert notebook.user_ns["seen"] == [1, 2]


def test_best_by_picks_the_best_checkpoint_by_a_metric(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ranked"
    manager = CheckpointManager(folder, keep_last=None)
    for step, loss in ((1, 0.5), (2, 0.2), (3, 0.9)):
        manager.save({"epoch": step}, step=step, metrics={"val_loss": loss})
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"restore epoch --dir {folder} --from best")
    assert str(caught.value) == (f"%checkpoint restore: --from best needs the metric to rank "
                                 f"by: pass --best-by METRIC[:min|max], as no checkpoint in "
                                 f"{folder} was saved with a keep_best rule (metrics saved: "
                                 "val_loss)")
    for ranking, step in (("val_loss", 2), ("val_loss:min", 2), ("val_loss:max", 3)):
        notice = notebook.run_line_magic("checkpoint", f"restore epoch --dir {folder} "
                                                       f"--from best --best-by {ranking}")
        assert str(notice).startswith(f"restored epoch from checkpoint step-00000000{step}:")
        assert notebook.user_ns["epoch"] == step


def test_a_name_the_checkpoint_lacks_stays_undefined(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    notebook.run_line_magic("checkpoint", f"save model --dir {folder}")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"restore model lr --dir {folder}")
    assert str(caught.value) == ("%checkpoint restore: the checkpoint has no 'lr' (it holds "
                                 "'model'); pass --no-strict to restore the rest")
    notice = notebook.run_line_magic("checkpoint", f"restore model lr --dir {folder} "
                                                   "--no-strict")
    assert str(notice).endswith("; not in it, still undefined: lr")
    assert "lr" not in notebook.user_ns


@pytest.mark.parametrize("name", ["model", "optimizer", "scheduler"])
def test_an_objects_state_needs_the_live_object(notebook, tmp_path: Path, name) -> None:
    folder = tmp_path / "ckpt"
    notebook.run_line_magic("checkpoint", f"save model optimizer scheduler epoch --dir {folder}")
    notebook.run_cell(f"del {name}; epoch = 8")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"restore {name} epoch --dir {folder}")
    assert str(caught.value) == (f"%checkpoint restore: cannot restore {name!r}: the "
                                 "checkpoint holds an object's state_dict(), which goes into "
                                 f"a live object: create {name} first, then restore")
    assert name not in notebook.user_ns and notebook.user_ns["epoch"] == 8


def test_a_module_of_other_keys_names_the_magic_option(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    notebook.run_cell("head = torch.nn.Linear(4, 8)")
    notebook.run_line_magic("checkpoint", f"save head --dir {folder}")
    notebook.run_cell("head = torch.nn.Sequential(torch.nn.Linear(4, 8))")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"restore head --dir {folder}")
    text = str(caught.value)
    assert "(--no-strict skips missing and unexpected keys)" in text
    assert "strict=False" not in text
    notebook.run_line_magic("checkpoint", f"restore head --dir {folder} --no-strict")


def test_the_largest_step_a_name_holds_is_saved_and_restored(notebook, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    info = notebook.run_line_magic("checkpoint", f"save model --dir {folder} --step 999999999")
    assert info.name == "step-999999999"
    notice = notebook.run_line_magic("checkpoint", f"restore model --dir {folder} "
                                                   "--from 999999999")
    assert str(notice).startswith("restored model from checkpoint step-999999999")


def test_list_needs_no_names_and_takes_the_configured_folder(notebook, tmp_path: Path) -> None:
    notebook.run_line_magic("config", f"CheckpointMagics.directory = {str(tmp_path)!r}")
    notebook.run_line_magic("checkpoint", "save model")
    table = notebook.run_line_magic("checkpoint", "list")
    assert [info.step for info in table.infos] == [0]


@pytest.mark.parametrize("line", ["save model model", "save model optimizer model --step 3",
                                  "restore model model", "auto model optimizer model"])
def test_a_variable_named_twice_is_refused(notebook, tmp_path: Path, line) -> None:
    folder = tmp_path / "one"
    notebook.run_line_magic("checkpoint", f"save model --dir {folder}")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"{line} --dir {folder}")
    assert str(caught.value) == (f"%checkpoint {line.split()[0]}: model is named twice: name "
                                 "each variable once")
    assert [info.step for info in CheckpointManager(folder).list()] == [0]
    assert auto.registered() is None


def test_a_value_that_holds_itself_is_one_line(notebook, tmp_path: Path) -> None:
    notebook.run_cell("history = {'losses': [0.5]}\nhistory['self'] = history")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"save model history --dir {tmp_path / 'c'}")
    assert str(caught.value) == ("%checkpoint save: a value in model, history nests too "
                                 "deeply or holds itself, which a checkpoint cannot store; "
                                 "save it without the cycle")
    assert list(tmp_path.iterdir()) == []


ACTIONS_ON_A_FOLDER = ["save model", "save model --async", "restore model", "list",
                       "auto model"]


@pytest.mark.parametrize("line", ACTIONS_ON_A_FOLDER)
@pytest.mark.parametrize("below", ["", "/runs", "/runs/v 2"])
def test_a_file_given_as_the_folder_is_one_line(notebook, tmp_path: Path, line,
                                                below) -> None:
    file = tmp_path / "notes 'v1'.txt"
    file.write_text("mine")
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"{line} --dir {shlex.quote(str(file) + below)}")
    assert str(caught.value) == (f"%checkpoint {line.split()[0]}: {file} is a file, not a "
                                 "folder; give a folder with --dir")
    assert file.read_text() == "mine" and list(tmp_path.iterdir()) == [file]
    assert auto.registered() is None


@pytest.mark.parametrize("line", ACTIONS_ON_A_FOLDER)
def test_a_folder_name_too_long_is_one_line(notebook, tmp_path: Path, line) -> None:
    folder = tmp_path / ("x" * 300)
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"{line} --dir {folder}")
    assert str(caught.value) == (f"%checkpoint {line.split()[0]}: cannot use the folder "
                                 f"{folder}: a name in its path is too long for its file "
                                 "system; give a shorter one with --dir")
    assert list(tmp_path.iterdir()) == [] and auto.registered() is None


@pytest.mark.parametrize(("line", "message"), [
    ('save model --dir "{folder}"', "could not write step-000000000 in {folder}: Read-only "
                                    "file system; the previous checkpoints are untouched; "
                                    "give one on a writable disk with --dir"),
    ('save model --dir "{folder}/new"', "cannot create the folder {folder}/new: Read-only file "
                                      "system; give one on a writable disk with --dir"),
    ('auto model --dir "{folder}"', "cannot use the folder {folder}: read-only file system; "
                                  "give one on a writable disk with --dir"),
    ('auto model --dir "{folder}/new"', "cannot use the folder {folder}/new: read-only file "
                                      "system; give one on a writable disk with --dir"),
])
def test_a_read_only_folder_is_one_line(notebook, read_only_folder: Path, line,
                                        message) -> None:
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", line.format(folder=read_only_folder))
    assert str(caught.value) == (f"%checkpoint {line.split()[0]}: "
                                 + message.format(folder=read_only_folder))
    assert auto.registered() is None


def test_a_background_save_into_a_read_only_folder_fails_at_the_next_call(
        notebook, read_only_folder: Path) -> None:
    notebook.run_line_magic("checkpoint", f'save model --async --dir "{read_only_folder}"')
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f'list --dir "{read_only_folder}"')
    text = str(caught.value)
    assert text.startswith("%checkpoint list: the previous asynchronous save failed: ")
    assert "Read-only file system" in text and "\n" not in text
    assert text.endswith("; give one on a writable disk with --dir")


@pytest.mark.parametrize(("option", "failing"), [("", "save"), ("--async", "list")])
def test_a_full_disk_is_one_line_and_keeps_the_checkpoints_it_has(
        notebook, full_folder: Path, option, failing) -> None:
    folder = shlex.quote(str(full_folder))
    notebook.run_line_magic("checkpoint", f"save epoch --dir {folder}")
    notebook.run_cell("big = torch.nn.Linear(128, 128)")  # 65 KiB of weights
    with pytest.raises(UsageError) as caught:
        notebook.run_line_magic("checkpoint", f"save big {option} --dir {folder}")
        notebook.run_line_magic("checkpoint", f"list --dir {folder}")  # a background failure
    text = str(caught.value)
    assert text.startswith(f"%checkpoint {failing}: ") and "\n" not in text
    assert "No space left on device" in text and str(full_folder) in text
    assert text.endswith("; free some space there or give another with --dir")
    assert [info.step for info in CheckpointManager(full_folder).list()] == [0]


@pytest.mark.parametrize(("number", "message"), [
    ("ENOTCONN", "cannot use the folder /content/drive/MyDrive/runs: transport endpoint is "
                 "not connected: its mount was lost (as Drive's is after a disconnection); "
                 "remount it (%mount_storage drive --force) or give another with --dir"),
    ("EACCES", "cannot use the folder /content/drive/MyDrive/runs: permission denied; give "
               "one you may write to with --dir"),
    ("EIO", "cannot use the folder /content/drive/MyDrive/runs: input/output error: its disk "
            "or connection failed; try again or give another with --dir"),
    ("EXDEV", "cannot use the folder /content/drive/MyDrive/runs: invalid cross-device link; "
              "give another with --dir"),
])
def test_storage_errors_this_machine_cannot_cause_read_as_one_line(number, message) -> None:
    """A lost Drive mount and another user's folder cannot be had here as root: their
    errors, as the kernel gives them, in the words the magics use."""
    from ipycloud.magics._storage_errors import storage_problem

    code = getattr(errno, number)
    error = OSError(code, os.strerror(code), "/content/drive/MyDrive/runs/step-000000001.pt")
    assert storage_problem("the folder /content/drive/MyDrive/runs", error, "--dir") == message
