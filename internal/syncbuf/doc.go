// Package syncbuf is a bytes.Buffer safe for concurrent use, for
// collecting a child process's or a logger's output while it runs.
package syncbuf
