import pytest

from cleaner.config import Config, ConfigError, describe, load_config


def test_defaults_are_the_papers():
    c = Config()
    assert (
        c.saar.gamma,
        c.saar.max_retries,
        c.saar.rollback_probability,
        c.saar.similarity_on,
    ) == (0.5, 3, 1.0, "code")


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 7\nsaar:\n  gamma: 0.3\n  similarity_on: call\n")
    c = load_config(path, ["saar.gamma=0.8", "saar.max_retries=5"])
    assert (c.seed, c.saar.gamma, c.saar.max_retries, c.saar.similarity_on) == (7, 0.8, 5, "call")


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("saar:\n  gama: 0.3\n", [], "run.yaml: saar.gama: unknown option"),
        ("saar:\n  gamma: high\n", [], "run.yaml: saar.gamma: expected a number"),
        ("seed: 1.5\n", [], "run.yaml: seed: expected an integer"),
        ("saar: 3\n", [], "run.yaml: saar: expected a mapping"),
        ("", ["saar.similarity_on=tokens"], "saar.similarity_on: must be one of"),
        ("", ["saar.rollback_probability=1.5"], "saar.rollback_probability must be in [0, 1]"),
        ("", ["seed"], "expected section.option=value"),
        ("saar: [\n", [], "run.yaml: invalid YAML"),
    ],
)
def test_bad_configs_name_the_source_and_the_field(tmp_path, yaml_text, overrides, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    assert message in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_every_option_has_help():
    rows = describe()
    assert {name for name, _, _ in rows} >= {"seed", "saar.gamma", "saar.max_retries"}
    assert all(help_text for _, _, help_text in rows)
