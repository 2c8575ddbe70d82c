"""bench/refault.py on a tiny tensor: the balloon's feature bit is read as Linux writes it, a
run writes its JSON whole, and bad arguments are refused by name."""

import json

import pytest


@pytest.fixture(scope="module")
def refault(load_script):
    return load_script("bench/refault.py")


@pytest.mark.parametrize(
    "bits, expected",
    [
        ("0110010100000000", True),  # the development machine's balloon: bit 5 set
        ("0110000100000000", False),  # stats and deflate-on-OOM only
        ("0110", False),  # shorter than bit 5
    ],
)
def test_free_page_reporting_reads_feature_bit_5(refault, tmp_path, bits, expected):
    dev = tmp_path / "bus/virtio/drivers/virtio_balloon/virtio0"
    dev.mkdir(parents=True)
    (dev / "features").write_text(bits + "\n")
    assert refault.free_page_reporting(tmp_path) is expected


def test_no_balloon_is_none(refault, tmp_path):
    assert refault.free_page_reporting(tmp_path) is None


def test_a_run_writes_every_pause_and_round(refault, tmp_path, capsys):
    out = tmp_path / "r.json"
    refault.main(["--gib", "0.001", "--pauses", "0,0.01", "--rounds", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    assert [r["pause_s"] for r in res["rows"]] == [0.0, 0.01]
    assert all(len(r["wall_s"]) == 2 and len(r["sys_s"]) == 2 for r in res["rows"])
    assert all(w >= 0 for r in res["rows"] for w in r["wall_s"])
    assert not list(tmp_path.glob("*.tmp"))
    assert "re-touched" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, field",
    [
        (["--gib", "0"], "--gib"),
        (["--gib", "nan"], "--gib"),
        (["--rounds", "0"], "--rounds"),
        (["--pauses", "-1"], "pause"),
        (["--pauses", "a,b"], "--pauses"),
    ],
)
def test_bad_arguments_are_refused_by_name(refault, capsys, args, field):
    with pytest.raises(SystemExit) as exc:
        refault.main(args)
    assert exc.value.code == 2
    assert field in capsys.readouterr().err
