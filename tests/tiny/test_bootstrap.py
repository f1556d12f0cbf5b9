import dataclasses
import json

import pytest

from cleaner.tiny.bootstrap import BootstrapSettings, bootstrap, default_model_dir
from cleaner.tiny.model import ModelShape
from cleaner.tiny.traces import TraceMix

SMALL = BootstrapSettings(
    n_traces=24,
    mix=TraceMix(failure_rate=0.5),
    vocab_size=700,
    shape=ModelShape(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64),
    short_prompt_epochs=1,
    held_out_traces=4,
    epochs=1,
    max_steps=3,
)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny"
    return bootstrap(out, seed=1, settings=SMALL, log=lambda line: None)


def test_bootstrap_writes_a_model_the_auto_classes_load_and_that_generates(small_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cleaner.tiny.traces import TOOLS

    model = AutoModelForCausalLM.from_pretrained(small_model)
    tokenizer = AutoTokenizer.from_pretrained(small_model)
    assert model.config.model_type == "qwen3"
    assert (small_model / "model.safetensors").exists()
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=8,
        do_sample=True,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )
    assert out.shape[1] > len(ids)


def test_bootstrap_json_records_the_data_mix_losses_and_timings(small_model):
    report = json.loads((small_model / "bootstrap.json").read_text())
    assert report["settings"]["seed"] == 1
    assert report["settings"]["mix"]["failure_rate"] == 0.5
    assert report["data"]["traces"] == 24 and report["data"]["failing_traces"] > 0
    assert [stage["stage"] for stage in report["training"]] == ["short_prompt", "rollout_layout"]
    assert all(stage["steps"] == 3 and stage["epoch_losses"] for stage in report["training"])
    assert 0.0 <= report["training"][-1]["held_out_digit_accuracy"] <= 1.0
    assert {"traces_s", "tokenize_s", "train_s"} <= set(report["timings"])
    assert report["model"]["parameters"] > 0
    # the build happened in a staging directory that is gone now
    assert [p.name for p in small_model.parent.iterdir()] == ["tiny"]


def test_bootstrap_refuses_to_overwrite_without_being_asked(small_model):
    with pytest.raises(FileExistsError):
        bootstrap(small_model, seed=1, settings=SMALL, log=lambda line: None)


def test_default_model_is_built_once_and_cached_by_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEANER_CACHE_DIR", str(tmp_path))
    cheaper = dataclasses.replace(
        SMALL, n_traces=4, held_out_traces=2, short_prompt_epochs=0, max_steps=1
    )
    path = default_model_dir(cheaper, log=lambda line: None)
    assert path.parent == tmp_path and path.name == f"tiny-{cheaper.key()}"
    stamp = (path / "bootstrap.json").stat().st_mtime_ns
    assert default_model_dir(cheaper, log=lambda line: None) == path
    assert (path / "bootstrap.json").stat().st_mtime_ns == stamp  # not rebuilt
    assert not list(tmp_path.glob(".*building*"))
    other = dataclasses.replace(cheaper, seed=5)
    assert other.key() != cheaper.key()
    assert not default_model_dir(other, build_if_missing=False).exists()


def test_the_check_loop_runs_the_models_own_code(small_model, sandbox):
    from cleaner.tiny.check import check_model

    result = check_model(
        small_model, n_problems=2, max_new_tokens=24, max_tool_calls=1, sandbox=sandbox
    )
    summary = result.summary()
    assert summary["problems"] == 2
    assert 0.0 <= summary["accuracy"] <= 1.0
