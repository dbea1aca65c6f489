package logx

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// jsonLines parses every line of b as a JSON object.
func jsonLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %q", sc.Text())
		out = append(out, m)
	}
	return out
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
		json    bool
		level   slog.Level
	}{
		{nil, "", false, slog.LevelWarn},
		{[]string{"--log_level", "debug", "--log_format", "json"}, "", true, slog.LevelDebug},
		{[]string{"--log_level", "ERROR"}, "", false, slog.LevelError},
		{[]string{"--log_level", "loud"}, `--log_level "loud": want debug, info, warn or error`, false, 0},
		{[]string{"--log_format", "xml"}, `--log_format "xml": want text or json`, false, 0},
		{[]string{"--log_format", "JSON"}, `--log_format "JSON": want text or json`, false, 0},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o := Flags(fs, "warn")
			require.NoError(t, fs.Parse(tc.args))
			err := o.Validate()
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				var se *SettingError
				require.True(t, errors.As(err, &se))
				assert.Equal(t, strings.TrimPrefix(tc.wantErr, "--"), se.KeyError())
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.level, o.Level())
			var buf bytes.Buffer
			l := o.New(&buf)
			l.Log(t.Context(), tc.level, "hello", "n", 1)
			l.Log(t.Context(), tc.level-1, "below")
			if tc.json {
				lines := jsonLines(t, buf.Bytes())
				require.Len(t, lines, 1)
				assert.Equal(t, "hello", lines[0]["msg"])
				assert.Equal(t, float64(1), lines[0]["n"])
			} else {
				require.Equal(t, 1, strings.Count(buf.String(), "\n"), buf.String())
				assert.Contains(t, buf.String(), "msg=hello n=1")
			}
		})
	}
}

// Zap writes slog records: levels mapped, fields as attributes, the
// component named; nothing below the handler's level is even encoded.
func TestZap(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	z := Zap(l, "etcd").Named("etcd-client").With(zap.String("endpoint", "127.0.0.1:2379"))
	z.Debug("hidden", zap.Int("n", 1))
	z.Info("dialing", zap.Int("attempt", 2), zap.Duration("wait", 0), zap.Strings("eps", []string{"a", "b"}))
	z.Warn("retrying", zap.Error(errors.New("boom")))
	z.Error("failed")
	require.False(t, z.Core().Enabled(zapcore.DebugLevel))
	lines := jsonLines(t, buf.Bytes())
	require.Len(t, lines, 3)
	for i, want := range []struct{ level, msg string }{{"INFO", "dialing"}, {"WARN", "retrying"}, {"ERROR", "failed"}} {
		assert.Equal(t, want.level, lines[i]["level"])
		assert.Equal(t, want.msg, lines[i]["msg"])
		assert.Equal(t, "etcd", lines[i]["component"])
		assert.Equal(t, "etcd-client", lines[i]["logger"])
		assert.Equal(t, "127.0.0.1:2379", lines[i]["endpoint"])
	}
	assert.Equal(t, float64(2), lines[0]["attempt"])
	assert.Equal(t, []any{"a", "b"}, lines[0]["eps"])
	assert.Equal(t, "boom", lines[1]["error"])

	// Quiet lowers a level: an embedded server's info is debug.
	buf.Reset()
	q := ZapQuiet(l, "etcd")
	q.Info("chatty")
	q.Warn("slow apply")
	q.Error("broken")
	lines = jsonLines(t, buf.Bytes())
	require.Len(t, lines, 2)
	assert.Equal(t, "INFO", lines[0]["level"])
	assert.Equal(t, "slow apply", lines[0]["msg"])
	assert.Equal(t, "ERROR", lines[1]["level"])
}

// A nil logger follows slog.Default() at each write, so a zap or gRPC
// logger built before the program's slog.SetDefault still follows it.
func TestNilFollowsDefault(t *testing.T) {
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	z, g := Zap(nil, "etcd"), GRPC(nil)
	var buf bytes.Buffer
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	z.Info("from etcd")
	g.Infof("[core] channel %d created", 1)
	lines := jsonLines(t, buf.Bytes())
	require.Len(t, lines, 2)
	assert.Equal(t, "from etcd", lines[0]["msg"])
	assert.Equal(t, "etcd", lines[0]["component"])
	assert.Equal(t, "[core] channel 1 created", lines[1]["msg"])
	assert.Equal(t, "grpc", lines[1]["component"])
}

// gRPC's info lines are debug; warnings and errors keep their level.
func TestGRPC(t *testing.T) {
	var buf bytes.Buffer
	g := GRPC(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	g.Info("state change")
	g.Infoln("state", "change")
	g.Warningln("transport", "closing")
	g.Errorf("dial %s failed", "x")
	require.True(t, g.V(0))
	require.False(t, g.V(2))
	out := buf.String()
	require.Equal(t, 2, strings.Count(out, "\n"), out)
	assert.Contains(t, out, `level=WARN msg="transport closing" component=grpc`)
	assert.Contains(t, out, `level=ERROR msg="dial x failed" component=grpc`)
}
