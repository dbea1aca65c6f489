// Package pbcodec encodes and decodes protobuf messages for the RPC layers
// (internal/crpc, internal/drpcx, internal/grpctune's gRPC codec) with the
// code protoc-gen-go-vtproto generates where a message has it, and with
// google.golang.org/protobuf otherwise. The bytes are the same protobuf
// wire format either way; only the speed differs (the generated code does
// not reflect over the message).
//
// Contract:
//   - Append and Size encode what proto.Marshal would (field order may
//     differ; protobuf does not fix it). Strings are not checked for UTF-8
//     on the way out: what a process sends it got from a decoder that
//     checked, or from its own code.
//   - Unmarshal resets the message, then decodes. A message decodes on the
//     fast path only if it also has CheckUTF8 (protoc-gen-decodehelp),
//     which runs after the decode, so every string field is valid UTF-8,
//     as proto3 requires and proto.Unmarshal checks; otherwise
//     proto.Unmarshal does it all. Where the message has PresizeVT, its
//     repeated fields are given their capacity before the decode.
//   - UnmarshalRequest is Unmarshal for what a peer sent (the crpc server
//     and the master's gRPC codecs use it): a message of 256 KiB or more
//     is first scanned against its descriptor, and one whose decode
//     would allocate more than MaxExpansion (8) times its size, or
//     MinDecodeBudget (64 MiB) if larger, is refused with ErrExpansion
//     before anything is decoded. Protobuf lets two bytes stand for an
//     empty message of a hundred bytes or more.
//
// The package owns no wire format of its own.
package pbcodec
