"""A server that deviates from the secure-sum protocol cannot expose one client's update (issue 34).

Four clients, the real ClientApp and privet's secure-sum stages, an attacker rewriting what the
ServerApp sends (:mod:`tests.attacks.deviating_server`). Each attack is judged by what matters:
can the attacker rebuild the target's quantised input bit for bit from what the clients sent it?
With a roster (the operator's trust anchor) every attack is refused; without one, the guarantee
holds against a server that follows the protocol only, and the same harness shows an attack that
then succeeds (so a refusal above is the protocol's doing, not the harness's blindness). Every
attack runs against both sum modes: quantised Gaussian shares (``secagg+``) and distributed
discrete Gaussian shares (``secagg+ddg``), whose masked input is one integer vector.
"""

from __future__ import annotations

import os
from typing import Any, cast

import pytest
from flwr.app import ConfigRecord, Message
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import bytes_to_public_key, generate_key_pairs, public_key_to_bytes

from privet.inprocess import FIRST_NODE_ID
from protocol import keys
from tests.attacks.deviating_server import Loot, secure_run, stage_of

TARGET = FIRST_NODE_ID  # client "0"
NODES = [FIRST_NODE_ID + i for i in range(4)]
MODES = pytest.mark.parametrize("mode", ["secagg+", "secagg+ddg"])


def _config(run_config_factory: Any, mode: str, r_min: int = 2) -> dict[str, Any]:
    cfg = run_config_factory(strategy="udp-fedavg", num_clients=4, noise_multiplier=4.0, noise_shares=4,
                             epsilon_min=20, epsilon_max=30, secure_aggregation=mode, min_train_clients=4,
                             num_server_rounds=1, **{"secagg.min-survivors": r_min, "secagg.threshold": 0.5},
                             **({"accountant": "rdp", "secagg.bits": 16} if mode == "secagg+ddg" else {}))
    return cast(dict[str, Any], cfg)


def _rewrite(msg: Message, **entries: Any) -> Message:
    record = dict(msg.content.config_records[keys.SECAGG_RECORD])
    record.update(entries)
    msg.content.config_records[keys.SECAGG_RECORD] = ConfigRecord(record)
    return msg


def _no_owner_twice(loot: Loot) -> bool:
    return all(len(shares) <= 4 for shares in loot.seed_shares.values())


class SplitSurvivors:
    """Attack 3: members shown different survivor sets (the target survives for some, dropped for others)."""

    def __init__(self, loot_ref: list[Loot]) -> None:
        self.loot_ref = loot_ref

    def __call__(self, node: int, msg: Message) -> Message | None:
        stage = stage_of(msg)
        if stage not in (keys.STAGE_CONSISTENCY, keys.STAGE_UNMASK):
            return msg
        with_target = node in NODES[:2]  # the target and one member see it alive; two see it dropped
        survivors = NODES if with_target else [n for n in NODES if n != TARGET]
        if stage == keys.STAGE_CONSISTENCY:
            return _rewrite(msg, **{keys.SECAGG_SURVIVORS: survivors})
        # unmask: hand each member the signatures gathered over the set it was shown
        gathered = self.loot_ref[0].consistency if self.loot_ref else {}
        signers = sorted(n for n, (sent, _) in gathered.items() if sorted(sent) == sorted(survivors))
        return _rewrite(msg, **{keys.SECAGG_SURVIVORS: survivors, keys.SECAGG_SIGNERS: signers,
                                keys.SECAGG_SIGNATURES: [gathered[n][1] for n in signers]})


@MODES
def test_members_shown_different_survivor_sets_expose_nothing_with_a_roster(run_config_factory, monkeypatch,
                                                                           tmp_path, mode):
    loot = Loot()
    loot, summary = secure_run(_config(run_config_factory, mode), SplitSurvivors([loot]), monkeypatch, tmp_path / "roster",
                               loot)
    assert not loot.exposed(TARGET)
    refused = {node: why for node, stage, why in loot.refusals if stage == keys.STAGE_UNMASK}
    # two members vouch for each set, a majority of four for neither: every member refuses to unmask
    assert set(refused) == set(NODES)
    assert all("vouch for the survivors" in why for why in refused.values())
    assert summary["failed_rounds"]  # the sum is not released, visibly
    assert not loot.key_shares.get(TARGET)  # nobody released the target's pairwise key


@MODES
def test_without_a_roster_the_same_split_exposes_the_target(run_config_factory, monkeypatch, mode):
    """The harness has power: with no trust anchor, a deviating server rebuilds one client's input."""
    loot = Loot()
    loot, _ = secure_run(_config(run_config_factory, mode), SplitSurvivors([loot]), monkeypatch, None, loot)
    assert loot.exposed(TARGET)


@MODES
def test_a_survivor_list_padded_with_duplicates_is_refused(run_config_factory, monkeypatch, tmp_path, mode):
    """Attack 2: [A, B, A, B] passes a count of r_min = 4; every member refuses it, nothing is unmasked."""
    def pad(node: int, msg: Message) -> Message | None:
        if stage_of(msg) in (keys.STAGE_CONSISTENCY, keys.STAGE_UNMASK):
            return _rewrite(msg, **{keys.SECAGG_SURVIVORS: [NODES[0], NODES[1], NODES[0], NODES[1]]})
        return msg

    for roster in (tmp_path / "roster", None):
        loot, summary = secure_run(_config(run_config_factory, mode, r_min=4), pad, monkeypatch, roster)
        assert not loot.exposed(TARGET) and not loot.seed_shares and not loot.key_shares
        assert {n for n, _, why in loot.refusals if "twice" in why} == set(NODES)
        assert summary["failed_rounds"]  # no sum released, visibly


@MODES
def test_one_message_naming_the_target_alive_and_dropped_yields_one_share_per_member(run_config_factory,
                                                                                     monkeypatch, tmp_path, mode):
    """Attack 1: the client derives who dropped from what it signed itself; any 'dead' list is ignored."""
    def both(node: int, msg: Message) -> Message | None:
        if stage_of(msg) == keys.STAGE_UNMASK:
            return _rewrite(msg, dead=[TARGET])  # Flower's stage would have returned both of its shares
        return msg

    for roster in (tmp_path / "roster", None):
        loot, summary = secure_run(_config(run_config_factory, mode), both, monkeypatch, roster)
        assert not loot.exposed(TARGET) and not loot.key_shares.get(TARGET)
        assert len(loot.seed_shares.get(TARGET, [])) == 4  # the honest sum went through
        assert not summary["failed_rounds"]


@MODES
def test_substituted_member_keys_are_caught_before_anything_is_shared(run_config_factory, monkeypatch, tmp_path,
                                                                      mode):
    """Attack 4: the server forwards its own keys as the other members'; the target checks them on the roster."""
    attacker = {n: generate_key_pairs() for n in NODES if n != TARGET}  # one key of its own per member
    loot = Loot()

    def own(n: int) -> bytes:  # the key the attacker shares with the target in member n's name
        return generate_shared_key(attacker[n][0], bytes_to_public_key(loot.pk2[TARGET]))

    def substitute(node: int, msg: Message) -> Message | None:
        if stage_of(msg) == keys.STAGE_COLLECT and node == TARGET and TARGET in loot.share_keys:
            # shares "from" the others, forged under its substituted keys, so the target goes on to train
            srcs = [n for n in NODES if n != TARGET]
            texts = [encrypt(own(n), share_keys_plaintext_concat(n, TARGET, os.urandom(32), os.urandom(32)))
                     for n in srcs]
            return _rewrite(msg, **{keys.SECAGG_SOURCES: srcs, keys.SECAGG_CIPHERTEXTS: texts})
        if stage_of(msg) != keys.STAGE_SHARE_KEYS or node != TARGET:
            return msg
        record = msg.content.config_records[keys.SECAGG_RECORD]
        nodes = cast(list[int], record[keys.SECAGG_NODES])
        pk2s = [k if n == TARGET else public_key_to_bytes(attacker[n][1])
                for n, k in zip(nodes, cast(list[bytes], record[keys.SECAGG_PK2S]), strict=True)]
        return _rewrite(msg, **{keys.SECAGG_PK2S: pk2s})

    loot, summary = secure_run(_config(run_config_factory, mode), substitute, monkeypatch, tmp_path / "roster", loot)
    refusal = [why for n, stage, why in loot.refusals if n == TARGET and stage == keys.STAGE_SHARE_KEYS]
    assert refusal and "not signed for this sum" in refusal[0] and "member" in refusal[0]
    assert TARGET not in loot.share_keys  # it encrypted nothing to the attacker's keys
    target = next(c for c in summary["clients"] if c["client_id"] == "0")
    assert target["epsilon_spent"] == 0  # and trained nothing, charged nothing

    # without a roster the substitution works: the attacker decrypts every share the target sent
    loot = Loot()
    loot, _ = secure_run(_config(run_config_factory, mode), substitute, monkeypatch, None, loot)
    dsts, texts = loot.share_keys[TARGET]
    opened = [share_keys_plaintext_separate(decrypt(own(d), t)) for d, t in zip(dsts, texts, strict=True)]
    assert len(opened) == len(dsts) == 3 and all(src == TARGET for src, *_ in opened)
    loot.seed_shares[TARGET] = [seed for *_, seed, _ in opened]
    loot.key_shares[TARGET] = [key for *_, key in opened]
    assert loot.exposed(TARGET)  # its self mask and pairwise key, so its input, unmasked


@pytest.mark.parametrize("bad", ["roster", "signing-key"])
def test_a_site_whose_roster_lacks_its_own_key_refuses_at_start(tmp_path, bad):
    """Bad input: a roster without the node's own key, or a key that is not the roster's, is one clear line."""
    from client.profile import resolve_profile
    from protocol.roster import generate

    roster = generate(["site-0", "site-1"], tmp_path / "a")
    other = generate(["site-0"], tmp_path / "b")
    node = {"partition-id": 0, "num-partitions": 2, "epsilon": 2.0, "client-id": "site-0",
            "roster": str(roster), "signing-key": str(tmp_path / "a" / "keys" / "site-0.pem")}
    node[bad] = str(other) if bad == "roster" else str(tmp_path / "b" / "keys" / "site-0.pem")
    with pytest.raises(ValueError, match="does not hold this site's signing key under client-id 'site-0'"):
        resolve_profile(node, {})
