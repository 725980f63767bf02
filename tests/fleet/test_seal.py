"""Fleet records signed with the fleet key (pool/fleet/seal.py): what is believed, one row per case."""

import json

import pytest

from pool.fleet.seal import Refused, seal, unseal

KEY = b"the-fleet-key"
RECORD = {"host": "h2", "url": "http://h2:8000", "snapshot": {"models": []}}
TEXT = json.dumps(RECORD)


def tampered(sealed: str) -> str:
    outer = json.loads(sealed)
    outer["record"] = outer["record"].replace("http://h2:8000", "http://evil:9")
    return json.dumps(outer)


@pytest.mark.parametrize("stored, under, reason", [
    (seal(TEXT, key=KEY, host_id="h2"), "h2", None),                               # as a host publishes it
    (TEXT, "h2", "unsigned"),                                                      # today's plain records
    (json.dumps({"record": TEXT}), "h2", "unsigned"),
    (json.dumps({"record": TEXT, "hmac": 1}), "h2", "unsigned"),
    (json.dumps([TEXT]), "h2", "unsigned"),
    ("not json", "h2", "not JSON"),
    (seal(TEXT, key=b"another-key", host_id="h2"), "h2", "badly signed"),
    (json.dumps({"record": TEXT, "hmac": "0" * 64}), "h2", "badly signed"),
    (tampered(seal(TEXT, key=KEY, host_id="h2")), "h2", "badly signed"),          # a changed url
    (seal(TEXT, key=KEY, host_id="h2"), "evil", "badly signed"),                  # h2's record, copied elsewhere
    (seal(json.dumps({**RECORD, "host": "evil"}), key=KEY, host_id="h2"), "h2", "not the record of the host"),
    (seal("[1]", key=KEY, host_id="h2"), "h2", "not the record of the host"),
    (seal("{", key=KEY, host_id="h2"), "h2", "signed, but not JSON"),
])
def test_unseal(stored, under, reason):
    if reason is None:
        assert unseal(stored, key=KEY, host_id=under) == RECORD
        assert unseal(stored.encode(), key=KEY, host_id=under) == RECORD      # as Redis gives it
    else:
        with pytest.raises(Refused, match=reason):
            unseal(stored, key=KEY, host_id=under)
