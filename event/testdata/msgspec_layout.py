#!/usr/bin/env python3
"""Independent oracle for event/testdata/golden.

Builds, with plain Python lists and dicts, the exact object tree that
vLLM's msgspec structs produce for each golden case, and packs it with
python3-msgpack (Debian package). It does not import or share code with
the Go encoder; the layout rules it follows are msgspec's:

  * EventBatch is array_like: always [ts, events, data_parallel_rank],
    data_parallel_rank None when unset (array_like never omits fields).
  * tag=True structs carry the class name: first element of an array_like
    struct, or the "type" key first in a map struct.
  * array_like events write every field; map events (vLLM >= 0.26) write
    the fields without defaults always and omit a defaulted field whose
    value equals its default (None).
  * ints: non-negative in unsigned formats, floats as float64, str as
    fixstr/str8/..., bytes as bin (msgpack-python with use_bin_type=True
    makes the same choices as msgspec).

Prints a JSON object {"<case>.<encoding>": "<hex>"}.
"""
import json
import sys

import msgpack

TS = 1700000000.5
EXTRA = [None, ("tenant-a",), ("mm", 300, b"\x00\x01", -200, 0.25, True, None)]
LONG_LORA = "lora-adapter-with-a-name-longer-than-31"
HASH32 = bytes(range(32))
HASH8 = bytes([0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1])
TOKENS16 = list(range(100, 117))  # 17 tokens: array16 header


def stored(enc, hashes, parent, tokens, block_size, lora_id, medium, lora_name,
           extra_keys=None, group_idx=None, kind=None, window=None):
    if enc == "array":
        return ["BlockStored", hashes, parent, tokens, block_size, lora_id,
                medium, lora_name, extra_keys, group_idx, kind, window]
    d = {"type": "BlockStored", "block_hashes": hashes,
         "parent_block_hash": parent, "token_ids": tokens,
         "block_size": block_size, "lora_id": lora_id, "medium": medium,
         "lora_name": lora_name}
    for k, v in (("extra_keys", extra_keys), ("group_idx", group_idx),
                 ("kv_cache_spec_kind", kind),
                 ("kv_cache_spec_sliding_window", window)):
        if v is not None:
            d[k] = v
    return d


def removed(enc, hashes, medium, group_idx=None):
    if enc == "array":
        return ["BlockRemoved", hashes, medium, group_idx]
    d = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group_idx is not None:
        d["group_idx"] = group_idx
    return d


def cleared(enc):
    return ["AllBlocksCleared"] if enc == "array" else {"type": "AllBlocksCleared"}


def update(enc, hashes, medium, object_key=None, replicas=None, group_idx=None):
    if enc == "array":
        return ["BlockUpdate", hashes, medium, object_key, replicas, group_idx]
    d = {"type": "BlockUpdate", "block_hashes": hashes, "medium": medium}
    for k, v in (("object_key", object_key), ("replicas", replicas),
                 ("group_idx", group_idx)):
        if v is not None:
            d[k] = v
    return d


def cases(enc):
    return {
        "stored_minimal": [TS, [stored(enc, [1], None, [1, 2, 3], 16, None, "GPU", None)], 0],
        "stored_full": [TS, [stored(enc, [2**64 - 1, 200, 70000], 5,
                                    [0, 127, 128, 255, 256, 65535, 65536, 151644], 16,
                                    3, "CPU", LONG_LORA, EXTRA, 0, "sliding_window",
                                    4096)], None],
        "stored_bytes_hash": [TS, [stored(enc, [HASH32], HASH8, [], 16, None, None, None)], 1],
        "stored_long_tokens": [TS, [stored(enc, [42], 41, TOKENS16, 17, None, "GPU", "a")], 0],
        "removed": [TS, [removed(enc, [1, 2**63], "GPU")], 0],
        "removed_group": [TS, [removed(enc, [7], None, 2)], None],
        "cleared": [TS, [cleared(enc)], 0],
        "update": [TS, [update(enc, [9], "CPU", "obj/1",
                               [("CPU", "tcp://10.0.0.1:7000"), ("DISK", "file:///x")])], 0],
        "update_minimal": [TS, [update(enc, [9], None)], None],
        "mixed": [1.25, [stored(enc, [10, 11], 9, [5, 6], 1, None, "GPU", None),
                         removed(enc, [10], "GPU"), cleared(enc)], 3],
        "empty": [0.0, [], None],
        # The shape of a batch captured from a vLLM 0.26.0 engine (as printed
        # in volcano-sh/kthena#1535), re-packed here.
        "vllm026_capture": [1789095808.8378847, [stored(
            enc, [15760518052499183552], None,
            [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198,
             151644, 77091, 198, 151667], 16, None, "GPU", None, [None], 0,
            "full_attention")], 0],
    }


def main():
    out = {}
    for enc in ("map", "array"):
        for name, obj in cases(enc).items():
            out[f"{name}.{enc}"] = msgpack.packb(obj, use_bin_type=True).hex()
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
