// Package testlog holds the logging helpers tests share:
//
//   - Capture, a slog.Handler that keeps every record at every level (with
//     the attributes of WithAttrs; WithGroup qualifies later keys as
//     "group.key"), for tests that assert on what a component logs. Pass
//     slog.New(c) as the component's Logger.
//   - QuietDefault, for a package's TestMain: slog.Default() becomes a
//     text handler on stderr at warn, or at the level CRESCENT_TEST_LOG
//     names (debug, info, warn, error), so the info lines of library code
//     whose Logger is nil do not flood test output. The log package keeps
//     writing to stderr directly (slog.SetDefault would route it through
//     the handler at info and hide it). A level it does not know exits 2.
//
// A test that asserts on log lines gives its component a Capture (or its
// own handler); it never relies on slog.Default(), which QuietDefault
// filters.
package testlog
