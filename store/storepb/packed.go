package storepb

import "fmt"

// Packer builds a PackedReplicas entry by entry: Add the replicas of an
// entry, then End it.
type Packer struct {
	p    *PackedReplicas
	open uint32 // replicas added since the last End
	last int    // index of the segment the last Add used
}

// NewPacker makes a packer sized for the given entries and replicas.
func NewPacker(entries, replicas int) *Packer {
	return &Packer{p: &PackedReplicas{
		Counts:  make([]uint32, 0, entries),
		Segment: make([]uint32, 0, replicas),
		Address: make([]uint64, 0, replicas),
		Size:    make([]uint64, 0, replicas),
		Status:  make([]ReplicaStatus, 0, replicas),
	}}
}

// Add appends a memory replica to the open entry.
func (k *Packer) Add(segment, protocol string, idHigh, idLow, addr, size uint64, status ReplicaStatus) {
	p := k.p
	// Replicas of a batch sit on a few segments, mostly the last one used.
	seg := -1
	if k.last < len(p.Segments) && p.Segments[k.last].matches(segment, protocol, idHigh, idLow) {
		seg = k.last
	} else {
		for i, s := range p.Segments {
			if s.matches(segment, protocol, idHigh, idLow) {
				seg = i
				break
			}
		}
	}
	if seg < 0 {
		seg = len(p.Segments)
		p.Segments = append(p.Segments, &MemorySegment{Name: segment, Protocol: protocol, Id: &UUID{High: idHigh, Low: idLow}})
	}
	k.last = seg
	p.Segment = append(p.Segment, uint32(seg))
	p.Address = append(p.Address, addr)
	p.Size = append(p.Size, size)
	p.Status = append(p.Status, status)
	k.open++
}

// End closes the open entry (an entry may have no replica).
func (k *Packer) End() {
	k.p.Counts = append(k.p.Counts, k.open)
	k.open = 0
}

// Packed returns what was built.
func (k *Packer) Packed() *PackedReplicas { return k.p }

func (s *MemorySegment) matches(name, protocol string, hi, lo uint64) bool {
	return s.Id.GetHigh() == hi && s.Id.GetLow() == lo && s.Name == name && s.Protocol == protocol
}

// Unpack checks p against the entries expected of it and returns each
// entry's replicas as memory descriptors, allocated together. The
// descriptors of one segment share its name and id: read them, do not
// change them.
func (p *PackedReplicas) Unpack(entries int) ([][]*ReplicaDescriptor, error) {
	if len(p.GetCounts()) != entries {
		return nil, fmt.Errorf("packed replicas: %d entries, want %d", len(p.GetCounts()), entries)
	}
	if p == nil {
		return make([][]*ReplicaDescriptor, entries), nil // no entry, as counted above
	}
	n := len(p.Address)
	total := 0
	for _, c := range p.Counts {
		if total += int(c); total > n {
			return nil, fmt.Errorf("packed replicas: entries count more than the %d replicas", n)
		}
	}
	if total != n || len(p.Segment) != n || len(p.Size) != n || len(p.Status) != n {
		return nil, fmt.Errorf("packed replicas: columns of %d/%d/%d/%d replicas, entries count %d",
			len(p.Segment), n, len(p.Size), len(p.Status), total)
	}
	for i, s := range p.Segments {
		if s == nil {
			return nil, fmt.Errorf("packed replicas: segment %d missing", i)
		}
	}
	out := make([][]*ReplicaDescriptor, entries)
	ptrs := make([]*ReplicaDescriptor, n)
	reps := make([]ReplicaDescriptor, n)
	mems := make([]MemoryDescriptor, n)
	for i := range n {
		si := p.Segment[i]
		if int(si) >= len(p.Segments) {
			return nil, fmt.Errorf("packed replicas: replica %d names segment %d of %d", i, si, len(p.Segments))
		}
		s := p.Segments[si]
		m := &mems[i]
		m.SegmentName, m.Protocol, m.SegmentId, m.BufferAddress, m.Size = s.Name, s.Protocol, s.Id, p.Address[i], p.Size[i]
		r := &reps[i]
		r.Type, r.Status, r.Memory = ReplicaType_REPLICA_TYPE_MEMORY, p.Status[i], m
		ptrs[i] = r
	}
	at := 0
	for e, c := range p.Counts {
		if c > 0 {
			out[e] = ptrs[at : at+int(c) : at+int(c)]
		}
		at += int(c)
	}
	return out, nil
}

// PackResults packs the outcomes of n items: item i's code and message
// from outcome, its number from value (nil for an RPC without one).
func PackResults(n int, outcome func(int) (int32, string), value func(int) uint64) *PackedResults {
	p := &PackedResults{Codes: make([]int32, n)}
	if value != nil {
		p.Values = make([]uint64, n)
	}
	for i := range n {
		code, msg := outcome(i)
		p.Codes[i] = code
		if code != 0 {
			p.Messages = append(p.Messages, msg)
		}
		if value != nil {
			p.Values[i] = value(i)
		}
	}
	return p
}

// Outcomes are the results of a batch's items as PackedResults.Unpack
// reads them.
type Outcomes struct {
	Codes    []int32
	messages []string // per item; nil when every item succeeded
	Values   []uint64 // nil when the RPC has none
}

// Message is item i's error message ("" when it succeeded).
func (o *Outcomes) Message(i int) string {
	if o.messages == nil {
		return ""
	}
	return o.messages[i]
}

// Unpack checks p against the n items expected of it (and their numbers,
// when values) and returns their outcomes.
func (p *PackedResults) Unpack(n int, values bool) (*Outcomes, error) {
	if len(p.GetCodes()) != n {
		return nil, fmt.Errorf("packed results: %d codes for %d items", len(p.GetCodes()), n)
	}
	if values && len(p.GetValues()) != n || !values && len(p.GetValues()) != 0 {
		return nil, fmt.Errorf("packed results: %d values for %d items", len(p.GetValues()), n)
	}
	o := &Outcomes{Codes: p.GetCodes(), Values: p.GetValues()}
	failed := 0
	for _, c := range p.GetCodes() {
		if c != 0 {
			failed++
		}
	}
	if failed != len(p.GetMessages()) {
		return nil, fmt.Errorf("packed results: %d messages for %d failed items", len(p.GetMessages()), failed)
	}
	if failed > 0 {
		o.messages = make([]string, n)
		j := 0
		for i, c := range p.GetCodes() {
			if c != 0 {
				o.messages[i] = p.GetMessages()[j]
				j++
			}
		}
	}
	return o, nil
}
