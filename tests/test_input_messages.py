"""Bad input names the key and its own allowed values (found by a fresh user's session of
2026-12-06): a list key's "not a number" error offers only what that key accepts, a synthetic
SBM name names the part that is wrong, and --cpus-per-client has one rule for 0 and -1."""

import pytest

from fedgraph.catalog import parse_sbm_name
from fedgraph.config import ConfigError, parse_run_config


@pytest.mark.parametrize(
    "key, value, method, allowed, refused",
    [
        ("budgets", "abc", "ppgnn", "finite numbers > 0", "inf"),
        ("steps", "abc", "ppgnn", "integers in [0, 256]", "inf"),
        ("level-shares", "a,b,c", "ppgnn", "one share in [0, 1]", "inf"),
        ("client-epsilons", "x", "gap", "'inf' for no limit", None),
    ],
)
def test_not_a_number_names_the_keys_own_values(key, value, method, allowed, refused):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": method, key: value})
    msg = str(err.value)
    assert key in msg and allowed in msg
    if refused:
        assert refused not in msg


@pytest.mark.parametrize(
    "key, method, allowed",
    [
        ("client-epsilons", "gap", "numbers > 0 separated by commas"),
        ("budgets", "ppgnn", "finite numbers > 0"),
    ],
)
def test_an_empty_entry_names_the_keys_own_values(key, method, allowed):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": method, key: "1,,4"})
    assert "empty entry in the list '1,,4'" in str(err.value) and allowed in str(err.value)


@pytest.mark.parametrize(
    "name, part",
    [
        ("synthetic-sbm:5:2", "nodes must be >= 10, got 5"),
        ("synthetic-sbm:100:200", "avg_degree must lie in (0, nodes - 1] = (0, 99], got 200"),
        ("synthetic-sbm:100:0", "avg_degree must lie"),
        ("synthetic-sbm:100:2:-1", "seed must be >= 0, got -1"),
    ],
)
def test_a_bad_sbm_name_names_the_wrong_part(name, part):
    with pytest.raises(ValueError) as err:
        parse_sbm_name(name)
    assert part in str(err.value)
    others = {"nodes must", "avg_degree must", "seed must"} - {part.split(" must")[0] + " must"}
    assert not any(o in str(err.value) for o in others)


@pytest.mark.parametrize("cpus", [0, -1, float("nan"), float("inf")])
def test_cpus_per_client_has_one_rule(cpus):
    from fedgraph.simulations.resources import check_resources

    with pytest.raises(ConfigError, match=r"--cpus-per-client: must be a finite number > 0"):
        check_resources(None, cpus, 0)


def test_more_cpus_than_the_machine_has_are_refused(monkeypatch):
    """``--num-cpus 64`` on 2 cores: Flower's pool started a client process per CPU, filled
    30 GiB and no client started within minutes (fresh user, 12-07)."""
    import os

    from fedgraph.simulations.resources import check_resources

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(
        ConfigError,
        match=r"--num-cpus: 64 is more than the 2 CPUs of this "
        r"machine \(allowed: 1 to 2;",
    ):
        check_resources(64, 1, 0)
    check_resources(2, 1, 0)
    check_resources(None, 1, 0)


def test_gpus_per_client_may_be_zero_not_negative():
    from fedgraph.simulations.resources import check_resources

    with pytest.raises(ConfigError, match=r"--gpus-per-client: must be a finite number >= 0"):
        check_resources(None, 1, -1)
    check_resources(None, 1, 0)


def test_an_unknown_client_state_mode_is_refused_naming_the_variable(monkeypatch):
    """``FEDGRAPH_CLIENT_STATE`` with a typo would silently keep the default: refused."""
    from fedgraph.simulations.resources import check_resources

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("FEDGRAPH_CLIENT_STATE", "objectstore")
    with pytest.raises(
        ConfigError,
        match=r"\$FEDGRAPH_CLIENT_STATE: unknown value 'objectstore'; "
        r"allowed: auto .* or object-store",
    ):
        check_resources(None, 1, 0)
    for ok in ("object-store", "auto", ""):
        monkeypatch.setenv("FEDGRAPH_CLIENT_STATE", ok)
        check_resources(None, 1, 0)


def test_an_unknown_college_lists_the_colleges_present(tmp_path):
    from fedgraph.data.facebook100 import find_facebook100

    folder = tmp_path / "facebook100"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match="no college file is there"):
        find_facebook100("Nowhere", tmp_path)
    for stem in ("Caltech36", "Amherst41"):
        (folder / f"{stem}.mat").write_bytes(b"")
    (folder / "notes.txt").write_text("not a college")
    with pytest.raises(FileNotFoundError) as err:
        find_facebook100("Nowhere", tmp_path)
    assert "colleges present there: Amherst41, Caltech36)" in str(err.value)
    assert find_facebook100("caltech36", tmp_path).name == "Caltech36.mat"


@pytest.mark.parametrize("override", ["num-clients=0", "num_clients=0"])
def test_fedgraph_run_says_what_num_clients_0_means(override):
    import typer

    from fedgraph.simulations.run_files import load_run_config

    with pytest.raises(typer.BadParameter) as err:
        load_run_config("gap-edge-cora", [override])
    msg = str(err.value)
    assert "num-clients: 0 (one client per supernode) applies under `flwr run`" in msg
    assert "[1, 100000]" in msg
    assert load_run_config("gap-edge-cora", ["num-clients=3"])["num-clients"] == 3


@pytest.mark.parametrize(
    "method, key, own",
    [
        ("gap", "epsilon", "(for method 'gap': client-epsilons"),
        ("privgnn", "epsilon", "(for method 'privgnn': client-epsilons"),
        ("ppgnn", "client-epsilons", "(for method 'ppgnn': budgets"),
    ],
)
def test_another_methods_epsilon_key_points_to_this_methods_own(method, key, own):
    from fedgraph.config import reject_keys_of_other_methods

    with pytest.raises(ConfigError) as err:
        reject_keys_of_other_methods({"method": method, key: 4})
    assert f"{key}: a key of method" in str(err.value) and own in str(err.value)


@pytest.mark.parametrize(
    "key, value, method, expected",
    [
        ("client-epsilons", "abc", "gap", "'abc' is not a number"),
        ("budgets", "abc", "ppgnn", "'abc' is not a number"),
        ("secure-aggregation", "maybe", "gap", "must be true or false (got 'maybe')"),
        ("timeout", "0", "ppgnn", "greater than 0 (got '0')"),
    ],
)
def test_the_message_shows_the_value_once_and_a_boolean_says_true_or_false(
    key, value, method, expected
):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": method, key: value})
    msg = str(err.value)
    assert expected in msg and msg.count(repr(value)) == 1, msg


def test_a_number_that_appears_in_the_bound_is_still_shown():
    """``timeout=0``: the bound "greater than 0" holds the digit, not the value."""
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": "gap", "timeout": 0})
    assert "timeout: Input should be greater than 0 (got 0); allowed: (0, inf)" in str(err.value)


def test_a_type_error_that_says_got_without_a_value_still_shows_the_value():
    """``seed=1.5``: pydantic's "got a number with a fractional part" names no value."""
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": "gap", "seed": 1.5})
    assert (
        "seed: Input should be a valid integer, got a number with a fractional part "
        "(got 1.5); allowed: [0, 9223372036854775807]" in str(err.value)
    )


def test_a_value_in_the_message_is_not_shown_twice():
    """A validator's own "got <value>" is the value: no second "(got ...)" (a regression of
    this day's change above, fresh user 12-07)."""
    with pytest.raises(ConfigError) as err:
        parse_run_config({"method": "ppgnn", "budgets": "1,nan"})
    assert "got [1.0, nan]" in str(err.value) and "(got" not in str(err.value)


def test_a_seed_beyond_a_signed_64_bit_integer_is_refused_naming_the_key():
    """2^64 passed the check and failed after Ray started ("Overflow when unpacking long
    long", exit 1, seed unnamed: fresh user, 12-07); 2^63 - 1 is the largest seed torch takes."""
    with pytest.raises(
        ConfigError,
        match=r"seed: Input should be less than or equal to "
        r"9223372036854775807 \(got 18446744073709551616\); "
        r"allowed: \[0, 9223372036854775807\]",
    ):
        parse_run_config({"method": "gap", "seed": 2**64})
    import torch

    assert parse_run_config({"method": "gap", "seed": 2**63 - 1}).seed == 2**63 - 1
    torch.Generator().manual_seed(2**63 - 1)
