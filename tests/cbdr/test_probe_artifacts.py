"""Damaged, incomplete or degenerate probe artifacts are refused at load with an
ArtifactError naming the file and what to do, never loaded into a gate that then decides on
NaN."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from rag_gates.cbdr import ConfidenceProbe, ProbeConfig, ProbePrompts
from rag_gates.errors import ArtifactError, RagGatesError


@pytest.fixture()
def saved(tmp_path: Path, tiny: Any) -> Path:
    torch.manual_seed(0)
    probe = ConfidenceProbe(ProbeConfig(model_id=tiny.model_id, hidden_size=tiny.hidden_size,
                                        num_layers=tiny.num_layers, layer=2,
                                        prompts=ProbePrompts(style="rag-gates")))
    return probe.save(tmp_path / "probe")


def rewrite(directory: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = directory / "probe.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _nan(name: str, index: int = 0) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        t[name].view(-1)[index] = float("nan")
    return change


def _zero_std(t: dict[str, torch.Tensor]) -> None:
    t["feature_std"][3] = 0.0


def _drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        del t[name]
    return change


def _short_mean(t: dict[str, torch.Tensor]) -> None:
    t["feature_mean"] = t["feature_mean"][:5].clone()


CASES = [
    ("nan-feature-std", _nan("feature_std"), "feature_std.*not finite"),
    ("inf-feature-mean", _nan("feature_mean", 7), "feature_mean.*not finite"),
    ("zero-feature-std", _zero_std, "feature_std.*zero or negative"),
    ("nan-weight", _nan("mlp.0.weight", 11), "mlp.0.weight.*not finite"),
    ("missing-feature-mean", _drop("feature_mean"), "no 'feature_mean'"),
    ("missing-feature-std", _drop("feature_std"), "no 'feature_std'"),
    ("wrong-shape-mean", _short_mean, r"feature_mean has shape \(5,\)"),
]


@pytest.mark.parametrize(("case", "change", "message"), CASES, ids=[c[0] for c in CASES])
def test_degenerate_or_incomplete_tensors_are_refused(
        saved: Path, case: str, change: Callable[[dict[str, torch.Tensor]], None],
        message: str) -> None:
    rewrite(saved, change)
    with pytest.raises(ArtifactError, match=message) as info:
        ConfidenceProbe.load(saved)
    assert str(saved / "probe.safetensors") in str(info.value)
    assert "train-probe" in str(info.value)


def test_truncated_weights_file_is_refused_with_its_path(saved: Path) -> None:
    path = saved / "probe.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ArtifactError, match="cannot be read") as info:
        ConfidenceProbe.load(saved)
    assert str(path) in str(info.value) and "train-probe" in str(info.value)


def test_garbage_weights_file_is_refused(saved: Path) -> None:
    (saved / "probe.safetensors").write_bytes(b"\x00not a safetensors file")
    with pytest.raises(ArtifactError, match="cannot be read"):
        ConfidenceProbe.load(saved)


@pytest.mark.parametrize("text", ["{not json", '{"model_id": 3}', "[]", ""])
def test_bad_config_is_an_artifact_error_naming_the_file(saved: Path, text: str) -> None:
    (saved / "probe.json").write_text(text)
    with pytest.raises(ArtifactError, match="not a valid probe config") as info:
        ConfidenceProbe.load(saved)
    assert str(saved / "probe.json") in str(info.value)
    assert isinstance(info.value, RagGatesError) and isinstance(info.value, ValueError)


def test_a_sound_probe_still_loads(saved: Path, tiny: Any) -> None:
    probe = ConfidenceProbe.load(saved, lm=tiny)
    assert all(0.0 <= c <= 1.0 for c in probe.confidence(tiny, ["Who wrote Hamlet?"]))


@pytest.mark.parametrize("name", ["feature_mean", "feature_std", "mlp.0.weight"])
def test_float64_tensors_are_read_as_float32(saved: Path, tiny: Any, name: str) -> None:
    """Issue 32, item 9a: a probe whose feature_mean was float64 loaded, then the first
    decision raised a raw dtype RuntimeError. Float tensors of any precision are read as
    float32 at load, and decide as the float32 probe does."""
    from rag_gates.cbdr import CBDRGate

    before = CBDRGate(tiny, ConfidenceProbe.load(saved, lm=tiny)).decide("Who wrote Hamlet?")
    rewrite(saved, lambda t: t.__setitem__(name, t[name].to(torch.float64)))
    probe = ConfidenceProbe.load(saved, lm=tiny)
    assert probe.mean.dtype == probe.std.dtype == torch.float32
    d = CBDRGate(tiny, probe).decide("Who wrote Hamlet?")
    assert d.score == pytest.approx(before.score, abs=1e-6)


def test_integer_feature_statistics_are_refused(saved: Path) -> None:
    rewrite(saved, lambda t: t.__setitem__("feature_std", torch.ones_like(
        t["feature_std"], dtype=torch.int64)))
    with pytest.raises(ArtifactError, match=r"feature_std has dtype torch.int64.*floating"):
        ConfidenceProbe.load(saved)


def test_weights_beside_another_saves_config_are_refused(saved: Path, tiny: Any,
                                                         tmp_path: Path) -> None:
    """What a reader meets between the two renames of a save over an existing probe (or a
    weights file copied from another probe): the other save's config would read these
    weights wrongly, so the pair is refused, and no temporary file is left behind."""
    other = ConfidenceProbe(ProbeConfig(model_id=tiny.model_id, hidden_size=tiny.hidden_size,
                                        num_layers=tiny.num_layers, layer=1,
                                        prompts=ProbePrompts(style="rag-gates")))
    other_dir = other.save(tmp_path / "other")
    assert sorted(p.name for p in other_dir.iterdir()) == ["probe.json", "probe.safetensors"]
    (saved / "probe.safetensors").write_bytes((other_dir / "probe.safetensors").read_bytes())
    with pytest.raises(ArtifactError, match=r"saved with another probe\.json"):
        ConfidenceProbe.load(saved)
    assert ConfidenceProbe.load(other_dir).config.layer == 1
