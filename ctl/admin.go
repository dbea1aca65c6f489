package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"text/tabwriter"
)

// Bounds on what the admin port may send: a JSON page, and one key of
// /get_all_keys (keys are at most the master's max_key_len, 4096 by
// default).
const (
	maxAdminJSON = 64 << 20
	maxKeyLine   = 1 << 20
)

func init() {
	commands = append(commands,
		&command{
			name: "ls", args: "", help: "list keys, sorted", nargs: [2]int{0, 0},
			setup: func(fs *flag.FlagSet) runFunc {
				prefix := fs.String("prefix", "", "only keys that start with this")
				return func(ctx context.Context, o *options, _ []string, stdio IO) error {
					return list(ctx, o, *prefix, stdio)
				}
			},
		},
		&command{
			name: "stat", args: "KEY", help: "size, replicas, lease and pins of KEY", nargs: [2]int{1, 1},
			setup: func(*flag.FlagSet) runFunc { return stat },
		},
		&command{
			name: "segments", help: "mounted segments: capacity, use, status", nargs: [2]int{0, 0},
			setup: func(*flag.FlagSet) runFunc { return segments },
		},
		&command{
			name: "clients", help: "clients with mounted segments", nargs: [2]int{0, 0},
			setup: func(*flag.FlagSet) runFunc { return clients },
		},
		&command{
			name: "health", help: "the master's health (exit 1 when unhealthy)", nargs: [2]int{0, 0},
			setup: func(*flag.FlagSet) runFunc { return health },
		},
	)
}

// adminGet fetches path from the admin port; the caller closes the body.
func adminGet(ctx context.Context, o *options, path string) (*http.Response, error) {
	hc, scheme, err := o.sec.adminHTTP()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+o.admin+path, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--admin %s: %w", o.admin, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("--admin %s: %w", o.admin, err)
	}
	resp.Body = &cancelBody{resp.Body, cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// adminError turns a non-200 answer into an error carrying its first line.
func adminError(o *options, path string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	msg := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	return fmt.Errorf("--admin %s: %s: %s: %s", o.admin, path, resp.Status, msg)
}

// adminJSON decodes path's JSON answer into v, refusing more than
// maxAdminJSON bytes.
func adminJSON(ctx context.Context, o *options, path string, v any) error {
	resp, err := adminGet(ctx, o, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return adminError(o, path, resp)
	}
	lr := &io.LimitedReader{R: resp.Body, N: maxAdminJSON + 1}
	if err := json.NewDecoder(lr).Decode(v); err != nil {
		if lr.N <= 0 {
			return fmt.Errorf("--admin %s: %s: answer larger than %d bytes", o.admin, path, maxAdminJSON)
		}
		return fmt.Errorf("--admin %s: %s: %w", o.admin, path, err)
	}
	return nil
}

// list streams /get_all_keys (sorted by the master), keeping the keys
// with the prefix.
func list(ctx context.Context, o *options, prefix string, stdio IO) error {
	resp, err := adminGet(ctx, o, "/get_all_keys")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return adminError(o, "/get_all_keys", resp)
	}
	w := bufio.NewWriter(stdio.Stdout)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxKeyLine)
	n := 0
	if o.json() {
		w.WriteString("[")
	}
	for sc.Scan() {
		k := sc.Text()
		if k == "" || !strings.HasPrefix(k, prefix) {
			continue
		}
		if o.json() {
			if n > 0 {
				w.WriteString(",")
			}
			b, _ := json.Marshal(k)
			w.WriteString("\n  ")
			w.Write(b)
		} else {
			w.WriteString(k)
			w.WriteByte('\n')
		}
		n++
	}
	if err := sc.Err(); err != nil {
		w.Flush()
		return fmt.Errorf("--admin %s: /get_all_keys: %w", o.admin, err)
	}
	if o.json() {
		if n > 0 {
			w.WriteString("\n")
		}
		w.WriteString("]\n")
	}
	return w.Flush()
}

// KeyInfo is stat's answer: the admin port's /query_key.
type KeyInfo struct {
	Key             string        `json:"key"`
	Size            uint64        `json:"size"`
	Complete        bool          `json:"complete"`
	Replicas        []ReplicaInfo `json:"replicas"`
	Leased          bool          `json:"leased"`
	LeaseDeadline   string        `json:"lease_deadline,omitempty"`
	SoftPin         bool          `json:"soft_pin"`
	SoftPinDeadline string        `json:"soft_pin_deadline,omitempty"`
	HardPin         bool          `json:"hard_pin"`
	Owner           string        `json:"owner,omitempty"`
	Started         string        `json:"started,omitempty"`
}

// ReplicaInfo is one replica of a KeyInfo.
type ReplicaInfo struct {
	Type     string `json:"type"`
	Status   string `json:"status"`
	Segment  string `json:"segment"`
	Address  uint64 `json:"address"`
	Size     uint64 `json:"size"`
	Protocol string `json:"protocol"`
}

func stat(ctx context.Context, o *options, pos []string, stdio IO) error {
	key := pos[0]
	path := "/query_key?key=" + url.QueryEscape(key)
	resp, err := adminGet(ctx, o, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return fmt.Errorf("stat %q: %w", key, errNotFound)
	default:
		return adminError(o, "/query_key", resp)
	}
	var k KeyInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAdminJSON)).Decode(&k); err != nil {
		return fmt.Errorf("--admin %s: /query_key: %w", o.admin, err)
	}
	if o.json() {
		return writeJSON(stdio.Stdout, k)
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%s\n", k.Key)
	fmt.Fprintf(tw, "size\t%d\n", k.Size)
	fmt.Fprintf(tw, "complete\t%v\n", k.Complete)
	fmt.Fprintf(tw, "lease\t%s\n", onOff(k.Leased, k.LeaseDeadline))
	fmt.Fprintf(tw, "soft pin\t%s\n", onOff(k.SoftPin, k.SoftPinDeadline))
	fmt.Fprintf(tw, "hard pin\t%v\n", k.HardPin)
	if !k.Complete {
		fmt.Fprintf(tw, "owner\t%s (put started %s)\n", k.Owner, k.Started)
	}
	fmt.Fprintf(tw, "replicas\t%d\n", len(k.Replicas))
	for i, r := range k.Replicas {
		fmt.Fprintf(tw, "  %d\t%s %s segment %s address %#x size %d %s\n", i, r.Type, r.Status, r.Segment, r.Address, r.Size, r.Protocol)
	}
	return tw.Flush()
}

func onOff(on bool, deadline string) string {
	switch {
	case !on:
		return "none"
	case deadline != "":
		return "until " + deadline
	}
	return "yes"
}

// SegmentInfo is one entry of segments: the admin port's /get_all_segments.
type SegmentInfo struct {
	Name        string `json:"name"`
	ID          string `json:"id"`
	Client      string `json:"client"`
	Base        uint64 `json:"base"`
	Capacity    uint64 `json:"capacity"`
	Used        uint64 `json:"used"`
	Allocations uint64 `json:"allocations"`
	LargestFree uint64 `json:"largest_free"`
	Protocol    string `json:"protocol"`
	Status      string `json:"status"`
	Suspect     bool   `json:"suspect"`
}

func allSegments(ctx context.Context, o *options) ([]SegmentInfo, error) {
	var segs []SegmentInfo
	if err := adminJSON(ctx, o, "/get_all_segments", &segs); err != nil {
		return nil, err
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].Name < segs[j].Name })
	return segs, nil
}

func segments(ctx context.Context, o *options, _ []string, stdio IO) error {
	segs, err := allSegments(ctx, o)
	if err != nil {
		return err
	}
	if o.json() {
		return writeJSON(stdio.Stdout, segs)
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCLIENT\tCAPACITY\tUSED\tALLOCS\tLARGEST FREE\tPROTOCOL\tSTATUS")
	for _, s := range segs {
		status := s.Status
		if s.Suspect {
			status += " (suspect)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", s.Name, s.Client, s.Capacity, s.Used, s.Allocations, s.LargestFree, s.Protocol, status)
	}
	return tw.Flush()
}

// ClientInfo is one entry of clients: a client and the segments it has
// mounted (the master knows clients through their segments).
type ClientInfo struct {
	ID       string   `json:"id"`
	Segments []string `json:"segments"`
	Capacity uint64   `json:"capacity"`
	Used     uint64   `json:"used"`
}

func clients(ctx context.Context, o *options, _ []string, stdio IO) error {
	segs, err := allSegments(ctx, o)
	if err != nil {
		return err
	}
	byID := map[string]*ClientInfo{}
	var out []*ClientInfo
	for _, s := range segs {
		c := byID[s.Client]
		if c == nil {
			c = &ClientInfo{ID: s.Client}
			byID[s.Client] = c
			out = append(out, c)
		}
		c.Segments = append(c.Segments, s.Name)
		c.Capacity += s.Capacity
		c.Used += s.Used
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if o.json() {
		if out == nil {
			out = []*ClientInfo{}
		}
		return writeJSON(stdio.Stdout, out)
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tSEGMENTS\tCAPACITY\tUSED")
	for _, c := range out {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\n", c.ID, strings.Join(c.Segments, ","), c.Capacity, c.Used)
	}
	return tw.Flush()
}

// errUnhealthy: the master answered, and is not healthy (exit 1).
var errUnhealthy = errors.New("master unhealthy")

func health(ctx context.Context, o *options, _ []string, stdio IO) error {
	resp, err := adminGet(ctx, o, "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return fmt.Errorf("--admin %s: /health: %w", o.admin, err)
	}
	msg := strings.TrimSpace(string(b))
	ok := resp.StatusCode == http.StatusOK
	if o.json() {
		if err := writeJSON(stdio.Stdout, map[string]any{"healthy": ok, "status": msg}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stdio.Stdout, msg)
	}
	if !ok {
		return fmt.Errorf("%w: %s", errUnhealthy, msg)
	}
	return nil
}
