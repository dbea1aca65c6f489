package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/crescent-kv/crescent/ha/internal/msgpfields"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

//go:generate msgp -tests=false -io=false -unexported
//msgp:ignore Encoder Decoder Header

// Format constants (the layout is in doc.go).
const (
	Magic   = "CRSNAP\r\n"
	Version = 1
	// MaxClusterID bounds the header's cluster id.
	MaxClusterID = 255
	// MaxFrame bounds a frame's payload; a decoder refuses a longer one
	// before allocating it. The encoder closes a frame at FrameTarget.
	MaxFrame    = 4 << 20
	FrameTarget = 64 << 10
	// Limits on a record's lists, checked by the generated decoder before
	// it allocates.
	MaxReplicas = 255
	MaxHashes   = 1 << 16
	MaxIndices  = 1 << 20
	headerFixed = 8 + 4 + 8 + 8 + 8 + 8 + 2
	trailerMark = 0xFFFFFFFF
)

// ErrCorruptBody is returned for a snapshot body that does not decode:
// a bad magic, version or checksum, a frame or list over its limit, a
// torn tail, a record that is not one.
var ErrCorruptBody = errors.New("snapshot: corrupt body")

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptBody, fmt.Sprintf(format, args...))
}

var bodyCRC = crc32.MakeTable(crc32.Castagnoli)

// Header opens a snapshot body.
type Header struct {
	Version   uint32 // Version when written; set by NewEncoder
	ClusterID string
	Seq       uint64 // the last log seq the snapshot includes
	Term      uint64
	Created   time.Time
	Records   uint64 // how many records follow
}

// record is a master.Record on the wire. Tags are the persisted format:
// never rename, reuse or retype one; a new field gets a new tag and
// decodes as its zero value from snapshots written before it existed.
type record struct {
	Kind uint8 `msg:"k"`

	PutGen      uint64   `msg:"put_gen,omitempty"`
	ResvNext    uint64   `msg:"resv_next,omitempty"`
	TableLen    uint32   `msg:"table_len,omitempty"`
	FreeIndices []uint32 `msg:"free_idx,omitempty,limit=1048576"`
	Mounts      []uint32 `msg:"mounts,omitempty,limit=1048576"`

	Index      uint32   `msg:"idx,omitempty"`
	Segment    *segment `msg:"seg,omitempty"`
	Unmounting bool     `msg:"unmounting,omitempty"`
	// Ranges: contiguous from RangeStart, their sizes; the free ones by
	// position in the run, with their ranks.
	RangeStart uint64   `msg:"r_start,omitempty"`
	RangeSizes []uint64 `msg:"r_sizes,omitempty,limit=16384"`
	RangeFree  []uint32 `msg:"r_free,omitempty,limit=16384"`
	RangeRank  []uint32 `msg:"r_rank,omitempty,limit=16384"`

	ClientHi uint64 `msg:"c_hi,omitempty"`
	ClientLo uint64 `msg:"c_lo,omitempty"`

	Key      string   `msg:"key,omitempty"`
	ID       uint64   `msg:"id,omitempty"`
	Size     uint64   `msg:"size,omitempty"`
	Complete bool     `msg:"complete,omitempty"`
	Leased   bool     `msg:"leased,omitempty"`
	SoftPin  bool     `msg:"soft,omitempty"`
	HardPin  bool     `msg:"hard,omitempty"`
	Gen      uint32   `msg:"gen,omitempty"`
	OwnerHi  uint64   `msg:"o_hi,omitempty"`
	OwnerLo  uint64   `msg:"o_lo,omitempty"`
	Lease    int64    `msg:"lease,omitempty"`
	Pin      int64    `msg:"pin,omitempty"`
	PinTTL   int64    `msg:"pin_ttl,omitempty"`
	Hashes   []uint64 `msg:"hashes,omitempty,limit=65536"`
	Segs     []uint32 `msg:"segs,omitempty,limit=255"`
	Addrs    []uint64 `msg:"addrs,omitempty,limit=255"`
	Release  int64    `msg:"release,omitempty"`
}

// segment is an alloc.Segment.
type segment struct {
	IDHi       uint64 `msg:"id_hi,omitempty"`
	IDLo       uint64 `msg:"id_lo,omitempty"`
	Name       string `msg:"name,omitempty"`
	Base       uint64 `msg:"base,omitempty"`
	Size       uint64 `msg:"size,omitempty"`
	ClientHi   uint64 `msg:"c_hi,omitempty"`
	ClientLo   uint64 `msg:"c_lo,omitempty"`
	Protocol   string `msg:"proto,omitempty"`
	TEEndpoint string `msg:"te,omitempty"`
}

func toRecord(r *master.Record) (*record, error) {
	w := &record{Kind: uint8(r.Kind), PutGen: r.PutGen, ResvNext: r.ResvNext, TableLen: r.TableLen,
		FreeIndices: r.FreeIndices, Mounts: r.Mounts, Index: r.Index, Unmounting: r.Unmounting,
		ClientHi: r.Client.Hi, ClientLo: r.Client.Lo, Key: r.Key, ID: r.ID, Size: r.Size,
		Complete: r.Complete, Leased: r.Leased, SoftPin: r.SoftPin, HardPin: r.HardPin, Gen: r.Gen,
		OwnerHi: r.Owner.Hi, OwnerLo: r.Owner.Lo, Lease: r.Lease, Pin: r.Pin, PinTTL: r.PinTTL,
		Hashes: r.Hashes, Segs: r.Segs, Addrs: r.Addrs, Release: r.Release}
	switch {
	case len(r.FreeIndices) > MaxIndices || len(r.Mounts) > MaxIndices:
		return nil, fmt.Errorf("snapshot: segment table of %d+%d indices (max %d)", len(r.FreeIndices), len(r.Mounts), MaxIndices)
	case len(r.Ranges) > master.MaxRangesPerRecord:
		return nil, fmt.Errorf("snapshot: %d ranges in a record (max %d)", len(r.Ranges), master.MaxRangesPerRecord)
	case len(r.Hashes) > MaxHashes || len(r.Segs) > MaxReplicas || len(r.Addrs) > MaxReplicas:
		return nil, fmt.Errorf("snapshot: %q: %d hashes, %d replicas (max %d, %d)", r.Key, len(r.Hashes), len(r.Segs), MaxHashes, MaxReplicas)
	}
	if r.Kind == master.RecordSegment {
		s := &r.Segment
		w.Segment = &segment{IDHi: s.ID.Hi, IDLo: s.ID.Lo, Name: s.Name, Base: s.Base, Size: s.Size,
			ClientHi: s.Client.Hi, ClientLo: s.Client.Lo, Protocol: s.Protocol, TEEndpoint: s.TEEndpoint}
	}
	if len(r.Ranges) > 0 {
		w.RangeStart = r.Ranges[0].Addr
		w.RangeSizes = make([]uint64, len(r.Ranges))
		for i, g := range r.Ranges {
			w.RangeSizes[i] = g.Size
			if g.Free {
				w.RangeFree = append(w.RangeFree, uint32(i))
				w.RangeRank = append(w.RangeRank, g.Rank)
			}
		}
	}
	return w, nil
}

func fromRecord(w *record) (*master.Record, error) {
	r := &master.Record{}
	return r, fillRecord(r, w)
}

// fillRecord sets r from w; r shares w's slices.
func fillRecord(r *master.Record, w *record) error {
	ranges := r.Ranges[:0]
	*r = master.Record{Kind: master.RecordKind(w.Kind), PutGen: w.PutGen, ResvNext: w.ResvNext, TableLen: w.TableLen,
		FreeIndices: w.FreeIndices, Mounts: w.Mounts, Index: w.Index, Unmounting: w.Unmounting,
		Client: master.UUID{Hi: w.ClientHi, Lo: w.ClientLo}, Key: w.Key, ID: w.ID, Size: w.Size,
		Complete: w.Complete, Leased: w.Leased, SoftPin: w.SoftPin, HardPin: w.HardPin, Gen: w.Gen,
		Owner: master.UUID{Hi: w.OwnerHi, Lo: w.OwnerLo}, Lease: w.Lease, Pin: w.Pin, PinTTL: w.PinTTL,
		Hashes: w.Hashes, Segs: w.Segs, Addrs: w.Addrs, Release: w.Release}
	if s := w.Segment; s != nil {
		r.Segment = alloc.Segment{ID: alloc.UUID{Hi: s.IDHi, Lo: s.IDLo}, Name: s.Name, Base: s.Base, Size: s.Size,
			Client: alloc.UUID{Hi: s.ClientHi, Lo: s.ClientLo}, Protocol: s.Protocol, TEEndpoint: s.TEEndpoint}
	}
	if len(w.RangeFree) != len(w.RangeRank) {
		return corrupt("%d free ranges, %d ranks", len(w.RangeFree), len(w.RangeRank))
	}
	if len(w.RangeSizes) > 0 {
		r.Ranges = ranges
		at := w.RangeStart
		for _, sz := range w.RangeSizes {
			r.Ranges = append(r.Ranges, alloc.Range{Addr: at, Size: sz})
			if at+sz < at {
				return corrupt("ranges wrap the address space")
			}
			at += sz
		}
		for i, j := range w.RangeFree {
			if int(j) >= len(r.Ranges) {
				return corrupt("free range %d of %d", j, len(r.Ranges))
			}
			r.Ranges[j].Free, r.Ranges[j].Rank = true, w.RangeRank[i]
		}
	}
	return nil
}

// Encoder writes a snapshot body: NewEncoder writes the header, Write
// each record, Close the last frame and the trailer.
type Encoder struct {
	w      *bufio.Writer
	crc    hash.Hash32 // of every byte written
	want   uint64
	n      uint64
	frame  []byte
	inFrm  uint32
	closed bool
	err    error
}

// NewEncoder writes h (Version set to the current one) to w.
func NewEncoder(w io.Writer, h Header) (*Encoder, error) {
	if len(h.ClusterID) > MaxClusterID {
		return nil, fmt.Errorf("snapshot: cluster id of %d bytes (max %d)", len(h.ClusterID), MaxClusterID)
	}
	e := &Encoder{w: bufio.NewWriterSize(w, 256<<10), crc: crc32.New(bodyCRC), want: h.Records}
	b := make([]byte, 0, headerFixed+len(h.ClusterID)+4)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint32(b, Version)
	b = binary.LittleEndian.AppendUint64(b, h.Seq)
	b = binary.LittleEndian.AppendUint64(b, h.Term)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Created.UnixNano()))
	b = binary.LittleEndian.AppendUint64(b, h.Records)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.ClusterID)))
	b = append(b, h.ClusterID...)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, bodyCRC))
	if err := e.write(b); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Encoder) write(b []byte) error {
	if e.err != nil {
		return e.err
	}
	e.crc.Write(b)
	_, e.err = e.w.Write(b)
	return e.err
}

// Write appends one record.
func (e *Encoder) Write(r *master.Record) error {
	if e.closed {
		return errors.New("snapshot: write after Close")
	}
	if e.n == e.want {
		return fmt.Errorf("snapshot: more than the %d records the header announced", e.want)
	}
	w, err := toRecord(r)
	if err != nil {
		return err
	}
	start := len(e.frame)
	if e.frame, err = w.MarshalMsg(e.frame); err != nil {
		return fmt.Errorf("snapshot: encode %v record: %w", r.Kind, err)
	}
	if len(e.frame)-start > MaxFrame {
		return fmt.Errorf("snapshot: %v record %q of %d bytes (max %d)", r.Kind, r.Key, len(e.frame)-start, MaxFrame)
	}
	if len(e.frame) > MaxFrame {
		// The record does not fit: close the frame before it.
		rec := append([]byte(nil), e.frame[start:]...)
		e.frame = e.frame[:start]
		if err := e.flush(); err != nil {
			return err
		}
		e.frame = append(e.frame, rec...)
	}
	e.inFrm++
	e.n++
	if len(e.frame) >= FrameTarget {
		return e.flush()
	}
	return nil
}

// flush writes the open frame: length, record count, CRC32C of the
// payload, payload.
func (e *Encoder) flush() error {
	if e.inFrm == 0 {
		return nil
	}
	var h [12]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(e.frame)))
	binary.LittleEndian.PutUint32(h[4:], e.inFrm)
	binary.LittleEndian.PutUint32(h[8:], crc32.Checksum(e.frame, bodyCRC))
	if err := e.write(h[:]); err != nil {
		return err
	}
	if err := e.write(e.frame); err != nil {
		return err
	}
	e.frame, e.inFrm = e.frame[:0], 0
	return nil
}

// Close writes the last frame and the trailer and flushes; it fails if
// fewer records were written than the header announced. It does not
// close the underlying writer.
func (e *Encoder) Close() error {
	if e.closed {
		return e.err
	}
	e.closed = true
	if e.n != e.want {
		e.err = fmt.Errorf("snapshot: %d records written, the header announced %d", e.n, e.want)
		return e.err
	}
	if err := e.flush(); err != nil {
		return err
	}
	var t [16]byte
	binary.LittleEndian.PutUint32(t[0:], trailerMark)
	binary.LittleEndian.PutUint64(t[4:], e.n)
	if err := e.write(t[:12]); err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(t[12:], e.crc.Sum32())
	if _, err := e.w.Write(t[12:]); err != nil {
		return err
	}
	return e.w.Flush()
}

// Decoder reads a snapshot body.
type Decoder struct {
	r     *bufio.Reader
	crc   hash.Hash32
	h     Header
	n     uint64
	frame []byte
	left  uint32 // records left in frame
	done  bool
	// Reused by Next: a record lives until the next call.
	w   record
	rec master.Record
}

// NewDecoder reads and checks the header.
func NewDecoder(r io.Reader) (*Decoder, error) {
	d := &Decoder{r: bufio.NewReaderSize(r, 256<<10), crc: crc32.New(bodyCRC)}
	b := make([]byte, headerFixed, headerFixed+MaxClusterID+4)
	if err := d.read(b, "header"); err != nil {
		return nil, err
	}
	if string(b[:8]) != Magic {
		return nil, corrupt("bad magic %q", b[:8])
	}
	le := binary.LittleEndian
	d.h = Header{Version: le.Uint32(b[8:]), Seq: le.Uint64(b[12:]), Term: le.Uint64(b[20:]),
		Created: time.Unix(0, int64(le.Uint64(b[28:]))), Records: le.Uint64(b[36:])}
	if d.h.Version != Version {
		return nil, corrupt("format version %d (this decoder reads %d)", d.h.Version, Version)
	}
	n := int(le.Uint16(b[44:]))
	if n > MaxClusterID {
		return nil, corrupt("cluster id of %d bytes (max %d)", n, MaxClusterID)
	}
	b = b[:headerFixed+n+4]
	if err := d.read(b[headerFixed:], "header"); err != nil {
		return nil, err
	}
	if got, want := le.Uint32(b[headerFixed+n:]), crc32.Checksum(b[:headerFixed+n], bodyCRC); got != want {
		return nil, corrupt("header checksum %#x, computed %#x", got, want)
	}
	d.h.ClusterID = string(b[headerFixed : headerFixed+n])
	return d, nil
}

func (d *Decoder) read(b []byte, what string) error {
	if _, err := io.ReadFull(d.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return corrupt("truncated in the %s", what)
		}
		return fmt.Errorf("snapshot: read %s: %w", what, err)
	}
	d.crc.Write(b)
	return nil
}

// Header is the snapshot's header.
func (d *Decoder) Header() Header { return d.h }

// Next returns the next record, or nil, nil after the last one once the
// trailer's count and whole-body checksum are verified. The record (and
// its slices) is valid until the next call.
func (d *Decoder) Next() (*master.Record, error) {
	if d.done {
		return nil, nil
	}
	if d.left == 0 {
		if err := d.nextFrame(); err != nil || d.done {
			return nil, err
		}
	}
	if err := checkFields(d.frame); err != nil {
		return nil, corrupt("record %d: %v", d.n, err)
	}
	// Fields a record omits are zero; slices keep their room.
	w := &d.w
	*w = record{FreeIndices: w.FreeIndices[:0], Mounts: w.Mounts[:0], RangeSizes: w.RangeSizes[:0],
		RangeFree: w.RangeFree[:0], RangeRank: w.RangeRank[:0], Hashes: w.Hashes[:0], Segs: w.Segs[:0], Addrs: w.Addrs[:0]}
	rest, err := w.UnmarshalMsg(d.frame)
	if err != nil {
		return nil, corrupt("record %d: %v", d.n, err)
	}
	d.frame = rest
	d.left--
	d.n++
	if d.left == 0 && len(rest) != 0 {
		return nil, corrupt("%d bytes after a frame's last record", len(rest))
	}
	if err := fillRecord(&d.rec, w); err != nil {
		return nil, err
	}
	return &d.rec, nil
}

func (d *Decoder) nextFrame() error {
	var h [12]byte
	if err := d.read(h[:4], "frame header"); err != nil {
		return err
	}
	le := binary.LittleEndian
	n := le.Uint32(h[:])
	if n == trailerMark {
		if err := d.read(h[4:12], "trailer"); err != nil {
			return err
		}
		body := d.crc.Sum32() // every byte before the checksum
		var c [4]byte
		if _, err := io.ReadFull(d.r, c[:]); err != nil {
			return corrupt("truncated in the trailer")
		}
		switch cnt := le.Uint64(h[4:]); {
		case le.Uint32(c[:]) != body:
			return corrupt("body checksum %#x, computed %#x", le.Uint32(c[:]), body)
		case cnt != d.n || cnt != d.h.Records:
			return corrupt("trailer counts %d records, read %d, header announced %d", cnt, d.n, d.h.Records)
		}
		if _, err := d.r.ReadByte(); err != io.EOF {
			return corrupt("bytes after the trailer")
		}
		d.done = true
		return nil
	}
	if err := d.read(h[4:12], "frame header"); err != nil {
		return err
	}
	cnt := le.Uint32(h[4:])
	switch {
	case n == 0 || n > MaxFrame:
		return corrupt("frame of %d bytes (max %d)", n, MaxFrame)
	case cnt == 0 || cnt > n:
		return corrupt("frame of %d bytes holding %d records", n, cnt)
	case d.n+uint64(cnt) > d.h.Records:
		return corrupt("more records than the %d the header announced", d.h.Records)
	}
	if cap(d.frame) < int(n) {
		d.frame = make([]byte, n)
	}
	d.frame = d.frame[:n]
	if err := d.read(d.frame, "frame"); err != nil {
		return err
	}
	if got, want := le.Uint32(h[8:]), crc32.Checksum(d.frame, bodyCRC); got != want {
		return corrupt("frame checksum %#x, computed %#x (record %d)", got, want, d.n)
	}
	d.left = cnt
	return nil
}

// Fields each record may hold; anything else is refused (a newer
// writer's field: importing half a state beats nothing only in silence).
var (
	recordFields  = msgpfields.Of(recordFieldNames...)
	segmentFields = msgpfields.Of("id_hi", "id_lo", "name", "base", "size", "c_hi", "c_lo", "proto", "te")
)

var recordFieldNames = []string{"k", "put_gen", "resv_next", "table_len", "free_idx", "mounts", "idx", "seg", "unmounting",
	"r_start", "r_sizes", "r_free", "r_rank", "c_hi", "c_lo", "key", "id", "size", "complete", "leased", "soft", "hard",
	"gen", "o_hi", "o_lo", "lease", "pin", "pin_ttl", "hashes", "segs", "addrs", "release"}

// checkFields refuses a record (at the start of b) holding a field this
// decoder does not know; the generated decoder would skip it.
func checkFields(b []byte) error {
	return msgpfields.Walk(b, recordFields, func(name string, v []byte) error {
		if name == "seg" {
			return msgpfields.WalkNested(v, segmentFields)
		}
		return nil
	})
}
