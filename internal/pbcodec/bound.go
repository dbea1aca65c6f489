package pbcodec

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

const (
	// MaxExpansion bounds what decoding a request may allocate, as a
	// multiple of its encoded size: protobuf lets two bytes stand for an
	// empty message of a hundred or more, so a request of 64 MiB could
	// otherwise become gigabytes before any handler looks at it. Real
	// requests of the size checked (item counts are bounded elsewhere, so
	// a large request has large items) decode to 1-4 times their size.
	MaxExpansion = 8
	// MinDecodeBudget is what any request may decode to, whatever its
	// size: a batch of small items (10,000 at most) may expand more than
	// MaxExpansion and still stays far below it.
	MinDecodeBudget = 64 << 20
	// checkFrom is the smallest request checked: below it even the worst
	// expansion (two bytes for a struct of a few hundred) stays within
	// MinDecodeBudget.
	checkFrom = 256 << 10
	// maxDepth bounds the nesting the estimate follows.
	maxDepth = 64
)

// ErrExpansion reports a request that would decode to more than
// MaxExpansion times its size.
var ErrExpansion = errors.New("pbcodec: request would decode to too much memory")

// UnmarshalRequest is Unmarshal for bytes a peer sent: a message of
// checkFrom bytes or more is first scanned, and refused with
// ErrExpansion when decoding it would allocate more than MaxExpansion
// times its size or MinDecodeBudget, whichever is larger.
func UnmarshalRequest(b []byte, m proto.Message) error {
	if len(b) >= checkFrom {
		n, err := decodedSize(b, m.ProtoReflect().Descriptor(), 0)
		if err != nil {
			return err
		}
		if budget := max(MaxExpansion*len(b), MinDecodeBudget); n > budget {
			return fmt.Errorf("%w: %d bytes would take about %d (at most %d)", ErrExpansion, len(b), n, budget)
		}
	}
	return Unmarshal(b, m)
}

// Go representation sizes the estimate charges: a pointer, a string or
// []byte header, a repeated element's slot (twice its size: an append
// may double the array).
const (
	ptrSize    = 8
	strSize    = 16
	bytesSize  = 24
	growth     = 2
	entrySlack = 48 // a map entry's share of the map's buckets
)

// decodedSize estimates the bytes decoding b as a message of md
// allocates beyond the message's own struct. Malformed bytes stop the
// estimate where they start (the decode that follows refuses them).
func decodedSize(b []byte, md protoreflect.MessageDescriptor, depth int) (int, error) {
	if depth > maxDepth {
		return 0, fmt.Errorf("%w: nested more than %d deep", ErrExpansion, maxDepth)
	}
	fields := md.Fields()
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return n, nil
		}
		b = b[l:]
		vl := protowire.ConsumeFieldValue(num, typ, b)
		if vl < 0 {
			return n, nil
		}
		v := b[:vl]
		b = b[vl:]
		fd := fields.ByNumber(num)
		if fd == nil {
			n += l + vl // kept as unknown bytes
			continue
		}
		var inner []byte
		if typ == protowire.BytesType {
			inner, _ = protowire.ConsumeBytes(v)
		}
		list := fd.IsList()
		switch kind := fd.Kind(); {
		case fd.IsMap():
			// An entry: its key and value, and the map's share.
			c, err := decodedSize(inner, fd.Message(), depth+1)
			if err != nil {
				return 0, err
			}
			n += c + entrySlack + structSize(fd.Message())
		case kind == protoreflect.MessageKind || kind == protoreflect.GroupKind:
			c, err := decodedSize(inner, fd.Message(), depth+1)
			if err != nil {
				return 0, err
			}
			n += c + structSize(fd.Message())
			if list {
				n += growth * ptrSize
			}
		case kind == protoreflect.StringKind:
			n += len(inner)
			if list {
				n += growth * strSize
			}
		case kind == protoreflect.BytesKind:
			n += len(inner)
			if list {
				n += growth * bytesSize
			}
		case list && typ == protowire.BytesType:
			// Packed: the decoder counts the elements first and sizes
			// the array exactly.
			n += packedCount(inner, kind) * scalarSize(kind)
		case list:
			n += growth * scalarSize(kind)
		}
	}
	return n, nil
}

// packedCount is the number of elements in a packed field's bytes.
func packedCount(b []byte, kind protoreflect.Kind) int {
	switch kind {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(b) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(b) / 8
	}
	c := 0
	for _, x := range b {
		if x < 0x80 {
			c++
		}
	}
	return c
}

func scalarSize(kind protoreflect.Kind) int {
	switch kind {
	case protoreflect.BoolKind:
		return 1
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind, protoreflect.EnumKind,
		protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return 4
	}
	return 8
}

var structSizes sync.Map // protoreflect.FullName -> int

// structSize is the size of md's generated Go struct (128 when the type
// is not registered).
func structSize(md protoreflect.MessageDescriptor) int {
	if v, ok := structSizes.Load(md.FullName()); ok {
		return v.(int)
	}
	size := 128
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName()); err == nil {
		if t := reflect.TypeOf(mt.Zero().Interface()); t.Kind() == reflect.Pointer {
			size = int(t.Elem().Size())
		}
	}
	structSizes.Store(md.FullName(), size)
	return size
}
