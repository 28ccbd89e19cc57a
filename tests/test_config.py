"""Config validation: defaults filled, and every error names key, value and what is allowed."""

import pytest
import yaml

from hpcdl.platform.kit.config import (
    ConfigError,
    check_inside,
    load_config,
    studies,
    study_config,
    validate_config,
)

REPO_CONFIGS = ["default.yaml", "paper.yaml", "test.yaml"]


@pytest.mark.parametrize("name", REPO_CONFIGS)
def test_repo_configs_validate(repo, name):
    cfg = load_config(repo / "configs" / name)
    assert cfg["studies"], name
    for study in cfg["studies"]:
        assert cfg[study]["runtime"] in ("local", "compss")


def test_defaults_are_filled():
    cfg = validate_config({"studies": []})
    assert cfg["results_dir"] == "results"
    assert cfg["data"]["fashion_mnist_dir"] == "/usr/share/datasets/fashion-mnist"


@pytest.mark.parametrize("bad, key, allowed", [
    ({"studies": ["nope"]}, "studies[0]", ", ".join(studies())),
    ({"results_dir": "../elsewhere"}, "results_dir", "relative path"),
    ({"unknown_key": 1}, "unknown_key", "known keys"),
    ({"data": {"fashion_mnist_dir": 5}}, "data.fashion_mnist_dir", "type string"),
    ({"studies": "checkpoint"}, "studies", "a list"),
])
def test_errors_name_key_value_and_allowed(bad, key, allowed):
    with pytest.raises(ConfigError) as err:
        validate_config({"studies": [], **bad})
    msg = str(err.value)
    assert f"config key '{key}'" in msg
    assert allowed in msg
    assert err.value.key == key


def test_bad_file_is_named(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("results_dir: [unclosed\n")
    with pytest.raises(ValueError, match="broken.yaml"):
        load_config(path)
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")


def test_check_inside_rejects_escapes():
    assert str(check_inside("x.dir", "scratch", "results")) == "results/scratch"
    for bad in ("../up", "/abs/path", "a/../../b"):
        with pytest.raises(ConfigError, match="x.dir"):
            check_inside("x.dir", bad, "results")


def test_study_config_keeps_only_its_block(repo):
    cfg = load_config(repo / "configs" / "default.yaml")
    study = cfg["studies"][0]
    part = study_config(cfg, study)
    assert part["studies"] == [study]
    assert set(part) == {"results_dir", "data", "studies", study}
    # A study config is itself a valid config.
    assert validate_config(yaml.safe_load(yaml.safe_dump(part)))[study] == cfg[study]


def test_task_app_command_line_exits_2_with_the_key(tmp_path, capsys):
    from hpcdl.platform.kit.config import config_from_args

    bad = tmp_path / "bad.yaml"
    bad.write_text("studies: [nope]\n")
    with pytest.raises(SystemExit) as exit_:
        config_from_args(["--config", str(bad)])
    assert exit_.value.code == 2
    assert "config key 'studies[0]'" in capsys.readouterr().err
    good = tmp_path / "good.yaml"
    good.write_text("studies: []\n")
    assert config_from_args(["--config", str(good)])["results_dir"] == "results"


def test_every_study_block_accepts_tuned_notes_whose_key_exists():
    note = {"key": "kakurenbo.world_size", "claims": ["kakurenbo_saves_time"], "why": "2 -> 1 after a fail"}
    cfg = validate_config({"studies": ["shuffle"], "shuffle": {"tuned": [note]}})
    assert cfg["shuffle"]["tuned"] == [note]
    assert validate_config({"studies": ["hpo"]})["hpo"]["tuned"] == []     # every block, default none
    with pytest.raises(ConfigError) as err:     # a note outliving its key
        validate_config({"studies": ["shuffle"], "shuffle": {"tuned": [{**note, "key": "kakurenbo.nope"}]}})
    assert err.value.key == "shuffle.tuned[0].key" and "a key of the shuffle block" in str(err.value)
    with pytest.raises(ConfigError) as err:     # a note must say why
        validate_config({"studies": ["shuffle"], "shuffle": {"tuned": [{"key": "epochs", "claims": ["x"]}]}})
    assert err.value.key.startswith("shuffle.tuned[0]") and "why" in str(err.value)


def test_snakemakes_schema_file_accepts_the_repo_configs_tuned_notes(repo, tmp_path):
    """Snakemake validates the config against write_full_schema's files, not against load_schema()."""
    from snakemake.utils import validate

    from hpcdl.platform.kit.config import read_config_file, write_full_schema

    schema = write_full_schema(tmp_path / "schema.yaml")
    cfg = read_config_file(repo / "configs" / "default.yaml")
    assert any(cfg[s].get("tuned") for s in studies() if s in cfg), "default.yaml has no tuned note to check"
    validate(cfg, str(schema))
    cfg["shuffle"]["tuned"][0]["colour"] = "red"
    with pytest.raises(Exception, match="colour"):
        validate(cfg, str(schema))


@pytest.mark.parametrize("study, key, claim", [
    ("microbatch", "exact_reference", "outputs_exact"),       # fp64 since the H200 run; the laptop too
    ("spatial", "train.grid", "loss_falls"),                  # the train run's grid is loss_falls' run
    ("spatial", "calibration.repeats", "oracle_error"),       # 5 -> 3 for the budget
    ("shuffle", "epochs", "kakurenbo_saves_time"),            # 6 -> 5 for the budget
])
def test_the_laptop_config_notes_each_change_in_the_config_that_runs_it(repo, study, key, claim):
    """#59: these were changed with no note in configs/default.yaml (or with one elsewhere only)."""
    from hpcdl.platform.kit.config import load_config

    notes = {n["key"]: n for n in load_config(repo / "configs" / "default.yaml")[study]["tuned"]}
    assert key in notes and claim in notes[key]["claims"] and notes[key]["why"].strip()
