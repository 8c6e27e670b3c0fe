"""The decay model: records, pure features, the versioned store, the predictor and the offline commands."""

from __future__ import annotations

import pickle

import pytest
from typer.testing import CliRunner

from caldera.interference.features import feature_names, mix_features
from caldera.interference.records import JobType, Profile
from caldera.interference.store import FORMAT_VERSION, ModelFileError, load_model, save_model

R50 = JobType("ResNet-50", 64, 1)
LM = JobType("LM", 20, 1)


def test_job_types_parse_gavel_names():
    assert JobType.parse("ResNet-50 (batch size 64)", 2) == JobType("ResNet-50", 64, 2)
    assert JobType.parse("A3C") == JobType("A3C", 0, 1)
    assert JobType("LM", 20).name == "LM (batch size 20)"


def test_gavel_pairs_become_decays_and_infeasible_pairs(gavel):
    assert len(gavel.profiles) == 83 and len(gavel.samples) > 1500
    assert all(0.0 <= s.decay <= 1.0 for s in gavel.samples)
    # a measured pair: decay is 1 - coloc / solo, and the pair is stored both ways round
    s = next(s for s in gavel.samples if s.target == R50 and s.corunners == (LM,) and s.gpu == "v100")
    assert s.decay == pytest.approx(1 - gavel.ratio("v100", R50, LM))
    assert any(x.target == LM and x.corunners == (R50,) and x.gpu == "v100" for x in gavel.samples)
    # 0.0 in the file (did not fit) is never learnt as a decay
    for gpu, mix in list(gavel.infeasible)[:50]:
        a, *rest = sorted(mix, key=str)
        b = rest[0] if rest else a
        assert 0.0 in (gavel.ratio(gpu, a, b), gavel.ratio(gpu, b, a))  # measured at least one way round


def test_features_are_pure_and_symmetric_in_corunners():
    a = Profile(R50, {"k80": 1.0, "p100": 3.0, "v100": 5.0})
    b = Profile(LM, {"k80": 2.0, "p100": 4.0, "v100": 4.5}, {"gpu_util_avg": 80.0})
    c = Profile(JobType("A3C", 0), {"k80": 1.5, "p100": 1.6, "v100": 1.7})
    for fs in ("identity", "profile"):
        row = mix_features(a, [b, c], "v100", fs, families=["A3C", "LM", "ResNet-50"])
        assert len(row) == len(feature_names(fs))
        assert row == mix_features(a, [c, b], "v100", fs, families=["A3C", "LM", "ResNet-50"])
    row = dict(zip(feature_names("profile"), mix_features(a, [b], "p100", "profile")))
    assert row["gpu_p100"] == 1.0 and row["co_gpu_util_avg"] == 80.0 and row["n_corunners"] == 1.0
    with pytest.raises(ValueError):
        feature_names("nope")


def test_trained_model_saves_loads_and_predicts_every_job_of_a_mix(gavel, tmp_path):
    pytest.importorskip("sklearn")
    from caldera.interference.train import train

    mf = train(gavel, "extra_trees", "profile+enc", source="gavel")
    path = save_model(tmp_path / "m.model", mf)
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = load_model(path)
    assert loaded.metadata["samples"] == len(gavel.samples) and loaded.metadata["estimator"] == "extra_trees"
    p = loaded.predictor()
    decays = p.predict([R50, LM], "v100")
    assert decays is not None and len(decays) == 2 and all(0.0 <= d <= 1.0 for d in decays)
    truth = [1 - gavel.ratio("v100", R50, LM), 1 - gavel.ratio("v100", LM, R50)]
    assert decays == pytest.approx(truth, abs=0.15)  # a pair it was trained on
    assert p.predict([R50], "v100") == [0.0]
    assert p.predict([R50, JobType("NeverSeen", 8)], "v100") is None  # unknown job: no answer, not a guess


def test_store_refuses_other_versions_and_foreign_files(tmp_path):
    bad = tmp_path / "x.model"
    bad.write_bytes(pickle.dumps({"format": "something-else"}))
    with pytest.raises(ModelFileError, match="not a Caldera"):
        load_model(bad)
    bad.write_bytes(pickle.dumps({"format": "caldera-interference-model", "version": FORMAT_VERSION + 1}))
    with pytest.raises(ModelFileError, match="format"):
        load_model(bad)


def test_cli_train_and_evaluate(gavel_file, tmp_path):
    pytest.importorskip("sklearn")
    from caldera.cli.main import app

    data = gavel_file.parent.parent
    runner = CliRunner()
    out = tmp_path / "i.model"
    r = runner.invoke(app, ["interference", "train", "--data-dir", str(data), "-e", "linear", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_model(out).metadata["estimator"] == "linear"
    r = runner.invoke(app, ["interference", "evaluate", "--data-dir", str(data), "-e", "linear", "-s", "random"])
    assert r.exit_code == 0, r.output
    assert "random_forest" in r.output and "identity" in r.output and "linear" in r.output
