"""Binary /stream frames and group commit (several requests / frames in one append script)."""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from websockets.sync.client import connect

from service.storage.codec import (
    decode_entry,
    decode_labels,
    encode_labels,
    encode_vector,
    parse_id,
)
from service.storage.store import Appended, Group, Store, TooManyClasses
from service.storage.store import connect as redis_connect
from tests.service.support import ServiceProcess, binary, core_learner, make_model, stream


def test_binary_frames_are_acked_in_order_and_learn_like_json(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    X, y = stream(120, 4, 3, seed=5)
    make_model(api, name, 4, gamma=0.05)
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        assert ws.response is not None
        assert "binary" in ws.response.headers["x-opml-frames"]
        for k in range(0, 120, 20):
            ws.send(binary(f"b{k}", X[k : k + 20], y[k : k + 20]))
        acks = [json.loads(ws.recv(timeout=30)) for _ in range(6)]
    assert [(a["ack"], a["first_seq"], a["last_seq"]) for a in acks] == [
        (f"b{k}", k + 1, k + 20) for k in range(0, 120, 20)
    ]
    ref = core_learner(X, y, dim=4, gamma=0.05)
    got = api.get(f"/v1/models/{name}/metric", params={"min_version": 120}).json()
    np.testing.assert_allclose(np.array(got["L"]), ref.L, rtol=0, atol=1e-12)


def test_malformed_binary_frames_get_error_frames_and_the_connection_survives(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    bad = [
        b"\x01\x00",  # shorter than the header length
        struct.pack("<I", 999) + b"{}",  # header length past the end
        binary(None, [[1, 2]], [], header=b"{not json"),  # header not JSON
        binary(None, [[1, 2]], [], header=b'{"id": "no-y"}'),  # no labels
        binary("short", [1, 2, 3], ["a", "b"]),  # 3 values for 2 x 2
        binary("long", [[1, 2, 3]], ["a"]),  # 3 values for 1 x 2
        binary("nan", [[1, 2], [1, np.nan]], ["a", "b"]),  # NaN in row 1
        binary("inf", [[np.inf, 2]], ["a"]),
        binary("bool-label", [[1, 2]], [True]),
    ]
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for frame in bad:
            ws.send(frame)
        ws.send(binary("ok", [[1, 2]], ["a"]))
        ws.send(json.dumps({"id": "json-ok", "x": [2, 1], "y": 3}))
        frames = [json.loads(ws.recv(timeout=10)) for _ in range(len(bad) + 2)]
    for frame in frames[: len(bad)]:
        assert frame["error"]["status"] == 422 and frame["error"]["detail"], frame
    assert [f.get("id") for f in frames[: len(bad)]] == [
        None, None, None, "no-y", "short", "long", "nan", "inf", "bool-label"
    ]  # fmt: skip
    nan = frames[6]["error"]
    assert nan["errors"][0]["loc"] == ["block", 1]
    assert frames[-2:] == [
        {"ack": "ok", "first_seq": 1, "last_seq": 1},
        {"ack": "json-ok", "first_seq": 2, "last_seq": 2},
    ]
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == 2


def test_a_frame_resent_in_the_other_encoding_is_deduplicated(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    X = [[1.0, 2.0], [0.5, -1.0]]
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        ws.send(binary("f1", X, ["a", 7]))
        first = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"id": "f1", "samples": [{"x": X[0], "y": "a"}, {"x": X[1], "y": 7}]}))
        again = json.loads(ws.recv(timeout=10))
        ws.send(binary("f1", [[9.0, 9.0], [0.5, -1.0]], ["a", 7]))  # same id, other samples
        conflict = json.loads(ws.recv(timeout=10))
    assert first == {"ack": "f1", "first_seq": 1, "last_seq": 2}
    assert again == {**first, "replayed": True}
    assert conflict["error"]["status"] == 409


def test_pipelined_frames_get_contiguous_seqs_and_one_bad_frame_affects_no_other(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)
    frames: list[str | bytes] = []
    for k in range(30):
        if k == 7:  # wrong dimension
            frames.append(json.dumps({"id": k, "x": [1, 2, 3], "y": "a"}))
        elif k == 12:  # 25 new classes: over OPML_MAX_CLASSES=20, refused alone
            frames.append(binary(k, np.ones((25, 2)), [f"c{i}" for i in range(25)]))
        elif k == 20:  # a resend of frame 3 while it may still be in the same group
            frames.append(json.dumps({"id": 3, "samples": [{"x": [3, 1], "y": 3 % 4}] * 2}))
        elif k % 2:
            frames.append(binary(k, [[k, 1], [k, 1]], [k % 4, k % 4]))
        else:
            frames.append(json.dumps({"id": k, "samples": [{"x": [k, 1], "y": k % 4}] * 2}))
    with connect(f"{service.ws_url}/v1/models/{name}/stream") as ws:
        for frame in frames:
            ws.send(frame)
        answers = [json.loads(ws.recv(timeout=30)) for _ in frames]
    ids = [a.get("ack", a.get("id")) for a in answers]
    assert ids == [3 if k == 20 else k for k in range(30)]  # frame 20 resends id 3
    assert answers[7]["error"]["status"] == 422
    assert answers[12]["error"]["status"] == 422
    assert answers[12]["error"]["type"].endswith("limit-exceeded")
    assert answers[20] == {**answers[3], "ack": 3, "replayed": True}
    fresh = [a for k, a in enumerate(answers) if k not in (7, 12, 20)]
    assert [(a["first_seq"], a["last_seq"]) for a in fresh] == [
        (2 * i + 1, 2 * i + 2) for i in range(len(fresh))
    ]
    # an ack means logged; wait (min_version, on a query) until applied before reading the model
    waited = api.get(f"/v1/models/{name}/metric", params={"min_version": 2 * len(fresh)})
    assert waited.status_code == 200
    model = api.get(f"/v1/models/{name}").json()
    assert model["logged_seq"] == model["version"] == 2 * len(fresh)
    assert model["classes"] == 4


def test_concurrent_requests_get_disjoint_contiguous_seqs_and_retries_replay(
    service: ServiceProcess, api: httpx.Client, name: str
) -> None:
    make_model(api, name, 2)

    def post(i: int) -> httpx.Response:
        with service.client() as client:
            body = {"samples": [{"x": [i, 1], "y": i % 3}] * (1 + i % 3)}
            return client.post(
                f"/v1/models/{name}/samples", json=body, headers={"Idempotency-Key": f"k{i}"}
            )

    with ThreadPoolExecutor(12) as pool:
        first = list(pool.map(post, range(24)))
        again = list(pool.map(post, range(24)))
    assert all(r.status_code == 202 for r in first)
    spans = sorted((r.json()["first_seq"], r.json()["last_seq"]) for r in first)
    total = sum(1 + i % 3 for i in range(24))
    assert spans[0][0] == 1 and spans[-1][1] == total
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans))
    for i, (r1, r2) in enumerate(zip(first, again, strict=True)):
        assert r2.status_code == 202 and r2.headers["Idempotent-Replayed"] == "true"
        assert r2.json() == r1.json()
        assert r1.json()["accepted"] == 1 + i % 3
    assert api.get(f"/v1/models/{name}").json()["logged_seq"] == total


def test_one_script_appends_groups_each_with_its_own_outcome(redis_url: str) -> None:
    async def run() -> list[Appended | TooManyClasses]:
        client = redis_connect(redis_url, 2.0)
        store = Store(client)
        model = f"groups-{time.time_ns()}"
        try:
            await store.create_model(model, {}, time.time())

            def group(keys: list[str], field: str, fp: str) -> Group:  # d = 1: x_i = i
                return Group(encode_vector(np.arange(len(keys))), keys, field, fp)

            groups = [
                group(["a", "b"], "h:one", "fp1"),
                group([f"c{i}" for i in range(5)], "h:two", "fp2"),  # over the limit of 4
                group(["a"], "h:one", "fp-other"),  # the first group's key again
                group(["c"], "", "fp3"),
                group(["d", "a", "d"], "h:four", "fp4"),
            ]
            out = await store.append_groups(
                model, groups, now_ms=int(time.time() * 1000), ttl_ms=60_000, max_classes=4
            )
            assert int(await client.hget(f"opml:{{{model}}}:meta", "seq")) == 6
            # one entry per logged group, id = its last seq, holding all of its samples
            log = await client.xrange(f"opml:{{{model}}}:log")
            assert [parse_id(entry_id) for entry_id, _ in log] == [(2, 1), (3, 1), (6, 1)]
            decoded = [decode_entry(fields, 1) for _, fields in log]
            assert [keys for _, keys in decoded] == [["a", "b"], ["c"], ["d", "a", "d"]]
            assert [X.ravel().tolist() for X, _ in decoded] == [[0, 1], [0], [0, 1, 2]]
            assert await client.smembers(f"opml:{{{model}}}:classes") == {b"a", b"b", b"c", b"d"}
            return out
        finally:
            await store.delete_model(model)
            await client.aclose()

    out = asyncio.run(run())
    assert out[0] == Appended(1, 2, fingerprint="fp1", puts=0)
    assert isinstance(out[1], TooManyClasses) and out[1].have == 2
    assert out[2] == Appended(1, 2, replayed=True, fingerprint="fp1")
    assert out[3] == Appended(3, 3, fingerprint="fp3", puts=0)
    assert out[4] == Appended(4, 6, fingerprint="fp4", puts=0)


def test_idempotency_records_go_past_their_ttl_or_the_cap_oldest_first(redis_url: str) -> None:
    """The append and enrol scripts keep at most ``max_records`` records (the oldest go first,
    at most ``added + 64`` per call: a lowered cap is reached over a few calls) and purge
    those past their TTL; a forgotten record's retry is logged again, a kept one replays."""

    async def run() -> None:
        client = redis_connect(redis_url, 2.0)
        store = Store(client)
        model = f"records-{time.time_ns()}"
        idem, expiry = f"opml:{{{model}}}:idem", f"opml:{{{model}}}:idem-exp"

        dropped: list[int] = []

        async def append(fields: list[str], now: int, cap: int) -> list[Any]:
            groups = [Group(encode_vector(np.zeros(1)), ["a"], f, f"fp-{f}") for f in fields]
            return await store.append_groups(model, groups, now_ms=now, ttl_ms=60_000,
                                             max_classes=4, max_records=cap,
                                             on_dropped=dropped.append)  # fmt: skip

        async def kept() -> set[str]:
            assert await client.hlen(idem) == await client.zcard(expiry)
            return {f.decode() for f in await client.hkeys(idem)}

        try:
            await store.create_model(model, {}, time.time())
            for i in range(5):
                await append([f"h:{i}"], now=1000 + i, cap=3)
            assert await kept() == {"h:2", "h:3", "h:4"}
            assert dropped == [1, 1]  # told only by the calls that removed any
            (replay,) = await append(["h:4"], now=1010, cap=3)
            assert replay == Appended(5, 5, replayed=True, fingerprint="fp-h:4")
            (again,) = await append(["h:0"], now=1011, cap=3)  # forgotten: logged again
            assert again == Appended(6, 6, fingerprint="fp-h:0", puts=0)
            assert await kept() == {"h:3", "h:4", "h:0"}
            # the gallery's enrol keys share the cap
            await store.enrol(model, {"item": b"v"}, idempotency_field="g:e",
                              fingerprint="fp-e", now_ms=1012, ttl_ms=60_000, max_items=9,
                              max_records=3, on_dropped=dropped.append)  # fmt: skip
            assert dropped == [1, 1, 1, 1] and await kept() == {"h:4", "h:0", "g:e"}
            # past their TTL: purged by the next call that writes (the cap aside)
            await append(["h:late"], now=1012 + 60_001, cap=0)
            assert await kept() == {"h:late"}
            # 200 records without a cap, then a cap of 10: at most added + 64 go per call
            await append([f"m:{i}" for i in range(200)], now=200_000, cap=0)
            sizes = []
            for i in range(3):
                await append([f"n:{i}"], now=200_001 + i, cap=10)
                sizes.append(await client.zcard(expiry))
            assert sizes == [200 + 1 - 65, 136 + 1 - 65, 10]  # (h:late: past its TTL)
            assert dropped[-3:] == [65, 65, 63]
            assert {"n:0", "n:1", "n:2"} <= await kept()
        finally:
            await store.delete_model(model)
            await client.aclose()

    asyncio.run(run())


def test_labels_are_logged_as_the_json_encoder_writes_them() -> None:
    """The log's ``y`` field, written directly for keys without escapes, is byte for byte what
    ``json.dumps`` makes of any keys (quotes, backslashes, control and non-ASCII characters)."""
    rng = np.random.default_rng(8)
    alphabet = ["a", "7", " ", '"', "\\", "\x00", "\n", "\x1f", "\x7f", "é", "日", "😀", "/"]
    for _ in range(2000):
        keys = [
            "".join(rng.choice(alphabet, size=int(rng.integers(1, 6))))
            for _ in range(int(rng.integers(1, 4)))
        ]
        expected = json.dumps(keys, separators=(",", ":"), ensure_ascii=False).encode()
        assert encode_labels(keys) == expected, keys
        assert decode_labels(encode_labels(keys)) == keys
