package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The C ABI's stores poll for the master's reply 200us unless
// CRESCENT_POLL_WAIT_US says otherwise (0: off; junk: the default).
func TestPollWaitEnv(t *testing.T) {
	t.Setenv("CRESCENT_POLL_WAIT_US", "")
	assert.Equal(t, defaultPollWait, pollWait(), "empty")
	t.Setenv("CRESCENT_POLL_WAIT_US", "0")
	assert.Equal(t, time.Duration(0), pollWait())
	t.Setenv("CRESCENT_POLL_WAIT_US", "50")
	assert.Equal(t, 50*time.Microsecond, pollWait())
	t.Setenv("CRESCENT_POLL_WAIT_US", "-3")
	assert.Equal(t, defaultPollWait, pollWait())
}
