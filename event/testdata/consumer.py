#!/usr/bin/env python3
"""A KV-event consumer written independently of Crescent's Go code.

It decodes the stream the way vLLM's own tests (tests/distributed/conftest.py
MockSubscriber) and llm-d's indexer (pkg/kvevents/engineadapter/
vllm_adapter.go) do, with Debian's python3-zmq and python3-msgpack:

  * SUB socket, subscribe to a topic prefix, recv_multipart ->
    [topic, seq (8-byte big-endian), payload];
  * payload = msgpack [ts, events, data_parallel_rank?];
  * an event is a tag-first array or a map tagged under "type"; maps are
    normalised to llm-d's positional layout; hashes are ints or bytes
    (last 8 bytes big-endian);
  * like llm-d, an unknown tag fails the whole batch (counted in
    "rejected"), the consumer goes on with the next one;
  * replay like vLLM's tests: a DEALER sends [b"", start] and reads
    [b"", topic, seq, payload] until the end marker (empty payload).

Usage: consumer.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC
Stops after the batch holding AllBlocksCleared, replays from seq 0 and
prints one JSON document.
"""
import json
import sys

import msgpack
import zmq

STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size",
          "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
          "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
REMOVED = ["block_hashes", "medium", "group_idx"]
KNOWN = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}


class UnknownTag(Exception):
    pass


def to_hash(h):
    if isinstance(h, int):
        return h & 0xFFFFFFFFFFFFFFFF
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:].rjust(8, b"\0"), "big")
    raise ValueError(f"bad hash {h!r}")


def fields(ev):
    if isinstance(ev, dict):
        tag = ev.get("type")
        if tag not in KNOWN:
            raise UnknownTag(tag)
        return [tag] + [ev.get(k) for k in KNOWN[tag]]
    tag = ev[0]
    if tag not in KNOWN:
        raise UnknownTag(tag)
    return list(ev) + [None] * (1 + len(KNOWN[tag]) - len(ev))


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    ts, events = batch[0], batch[1]
    dp = batch[2] if len(batch) > 2 else None
    assert isinstance(ts, float), ts
    out = []
    for ev in events:
        f = fields(ev)
        if f[0] == "BlockStored":
            out.append({"tag": f[0], "hashes": [to_hash(h) for h in f[1]],
                        "parent": None if f[2] is None else to_hash(f[2]),
                        "tokens": f[3], "block_size": f[4], "medium": f[6],
                        "lora_name": f[7], "group_idx": f[9]})
        elif f[0] == "BlockRemoved":
            out.append({"tag": f[0], "hashes": [to_hash(h) for h in f[1]], "medium": f[2]})
        else:
            out.append({"tag": f[0]})
    return dp, out


def main():
    endpoint, replay_endpoint, topic = sys.argv[1:4]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    result = {"seqs": [], "events": [], "rejected": 0, "dp": [], "topics": []}
    done = False
    while not done:
        if not sub.poll(20000):
            result["error"] = "timeout"
            break
        t, seq_bytes, payload = sub.recv_multipart()
        result["topics"].append(t.decode())
        result["seqs"].append(int.from_bytes(seq_bytes, "big"))
        try:
            dp, events = decode(payload)
        except UnknownTag:
            result["rejected"] += 1
            continue
        result["dp"].append(dp)
        result["events"].extend(events)
        done = any(e["tag"] == "AllBlocksCleared" for e in events)

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replay = {"seqs": [], "topics": [], "end": False}
    while dealer.poll(20000):
        frames = dealer.recv_multipart()
        assert frames[0] == b"", frames
        if not frames[-1]:
            replay["end"] = int.from_bytes(frames[-2], "big") == 2**64 - 1
            break
        _, t, seq_bytes, _payload = frames
        replay["topics"].append(t.decode())
        replay["seqs"].append(int.from_bytes(seq_bytes, "big"))
    result["replay"] = replay
    sub.close(linger=0)
    dealer.close(linger=0)
    ctx.term()
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
