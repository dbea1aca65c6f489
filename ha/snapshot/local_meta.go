package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"time"
)

// ErrCorrupt is returned for a meta record or LATEST marker whose bytes
// do not decode or fail their checksum.
var ErrCorrupt = errors.New("snapshot: corrupt catalog record")

// maxMetaSize bounds an encoded Meta read from disk or Redis; a real one
// is about 200 bytes.
const maxMetaSize = 4096

const metaVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaRecord is Meta's JSON form (doc.go, "Catalogs").
type metaRecord struct {
	V        int       `json:"v"`
	ID       string    `json:"id"`
	Seq      uint64    `json:"seq"`
	Term     uint64    `json:"term"`
	Created  time.Time `json:"created"`
	Size     int64     `json:"size"`
	Checksum uint32    `json:"checksum"`
}

// encodeMeta is the JSON object, "\n", its CRC32C as 8 lower-case hex
// digits, "\n". Created is stored in UTC so that equal Metas encode to
// equal bytes (a repeated Publish compares them).
func encodeMeta(m Meta) []byte {
	b, err := json.Marshal(metaRecord{V: metaVersion, ID: m.ID, Seq: m.Seq, Term: m.Term,
		Created: m.Created.UTC(), Size: m.Size, Checksum: m.Checksum})
	if err != nil { // checkMeta refused what would fail
		panic(fmt.Sprintf("snapshot: encode meta %s: %v", m.ID, err))
	}
	b = append(b, '\n')
	return append(b, encodeCRC(b[:len(b)-1])...)
}

// encodeCRC is the checksum line of body.
func encodeCRC(body []byte) []byte {
	return fmt.Appendf(nil, "%08x\n", crc32.Checksum(body, castagnoli))
}

// decodeMeta checks and decodes encodeMeta's bytes; want, when not
// empty, is the id the record must carry (its file name or key).
func decodeMeta(b []byte, want string) (Meta, error) {
	bad := func(why string, args ...any) (Meta, error) {
		name := want
		if name == "" {
			name = "record"
		}
		return Meta{}, fmt.Errorf("%w: meta %s: %s", ErrCorrupt, name, fmt.Sprintf(why, args...))
	}
	if len(b) > maxMetaSize {
		return bad("%d bytes, more than %d", len(b), maxMetaSize)
	}
	if len(b) < 10 || b[len(b)-1] != '\n' {
		return bad("truncated")
	}
	body, sum := b[:len(b)-10], b[len(b)-9:len(b)-1]
	if b[len(b)-10] != '\n' {
		return bad("no checksum line")
	}
	crc, err := strconv.ParseUint(string(sum), 16, 32)
	if err != nil {
		return bad("checksum %q is not hex", sum)
	}
	if got := crc32.Checksum(body, castagnoli); uint32(crc) != got {
		return bad("checksum mismatch: stored %08x, computed %08x", crc, got)
	}
	var r metaRecord
	if err := json.Unmarshal(body, &r); err != nil {
		return bad("%v", err)
	}
	if r.V != metaVersion {
		return bad("version %d, want %d", r.V, metaVersion)
	}
	m := Meta{ID: r.ID, Seq: r.Seq, Term: r.Term, Created: r.Created, Size: r.Size, Checksum: r.Checksum}
	if err := checkMeta(m); err != nil {
		return bad("%v", err)
	}
	if want != "" && m.ID != want {
		return bad("holds id %s", m.ID)
	}
	return m, nil
}
