package testlog

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/crescent-kv/crescent/internal/logx"
)

// LevelEnv names the level of QuietDefault's handler.
const LevelEnv = "CRESCENT_TEST_LOG"

// QuietDefault sets slog's default logger for a test binary (see the
// package doc). Call it first in TestMain.
func QuietDefault() {
	o := logx.Options{LogLevel: os.Getenv(LevelEnv), LogFormat: logx.FormatText}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "testlog: %s=%q: want debug, info, warn or error\n", LevelEnv, o.LogLevel)
		os.Exit(2)
	}
	flags, out := log.Flags(), log.Writer()
	slog.SetDefault(o.New(os.Stderr))
	log.SetFlags(flags)
	log.SetOutput(out)
}

// Capture is a slog.Handler keeping every record it is given, at every
// level. The zero value is ready; it is safe for concurrent use. The
// handlers of WithAttrs and WithGroup keep their records in it too.
type Capture struct {
	root   *Capture // nil: this one
	attrs  []slog.Attr
	prefix string // the groups of WithGroup: "a.b."

	mu   sync.Mutex // root's
	recs []slog.Record
}

func (c *Capture) store() *Capture {
	if c.root != nil {
		return c.root
	}
	return c
}

func (c *Capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *Capture) WithAttrs(as []slog.Attr) slog.Handler {
	n := &Capture{root: c.store(), prefix: c.prefix, attrs: slices.Clone(c.attrs)}
	for _, a := range as {
		n.attrs = append(n.attrs, slog.Attr{Key: c.prefix + a.Key, Value: a.Value})
	}
	return n
}

func (c *Capture) WithGroup(name string) slog.Handler {
	if name == "" {
		return c
	}
	return &Capture{root: c.store(), attrs: c.attrs, prefix: c.prefix + name + "."}
}

func (c *Capture) Handle(_ context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(c.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(slog.Attr{Key: c.prefix + a.Key, Value: a.Value})
		return true
	})
	s := c.store()
	s.mu.Lock()
	s.recs = append(s.recs, out)
	s.mu.Unlock()
	return nil
}

// Records returns the records kept so far.
func (c *Capture) Records() []slog.Record {
	s := c.store()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]slog.Record, len(s.recs))
	for i, r := range s.recs {
		out[i] = r.Clone()
	}
	return out
}

// Mentioning returns the records whose message or attributes (as
// key=value) contain sub.
func (c *Capture) Mentioning(sub string) []slog.Record {
	var out []slog.Record
	for _, r := range c.Records() {
		text := r.Message
		r.Attrs(func(a slog.Attr) bool { text += " " + a.String(); return true })
		if strings.Contains(text, sub) {
			out = append(out, r)
		}
	}
	return out
}

// Line is a record as level and attributes (values as slog.Value.Any).
type Line struct {
	Level slog.Level
	Attrs map[string]any
}

// Take returns the records with message msg as Lines and forgets every
// record kept so far, so the next Take sees only what came after.
func (c *Capture) Take(msg string) []Line {
	s := c.store()
	s.mu.Lock()
	recs := s.recs
	s.recs = nil
	s.mu.Unlock()
	var out []Line
	for _, r := range recs {
		if r.Message != msg {
			continue
		}
		l := Line{Level: r.Level, Attrs: map[string]any{}}
		r.Attrs(func(a slog.Attr) bool {
			l.Attrs[a.Key] = a.Value.Any()
			return true
		})
		out = append(out, l)
	}
	return out
}
