package local

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The reference's environment variables for the local hot cache.
const (
	EnvCacheSize = "MC_STORE_LOCAL_HOT_CACHE_SIZE"
	EnvBlockSize = "MC_STORE_LOCAL_HOT_BLOCK_SIZE"
	EnvUseShm    = "MC_STORE_LOCAL_HOT_CACHE_USE_SHM"
	EnvAdmission = "MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD"
)

// ApplyEnv sets o's cache fields from the MC_STORE_LOCAL_HOT_*
// variables that are set (sizes as "256mb", "8gb" or bytes; shm "1" or
// "true"); a malformed value is an error naming the variable.
func (o *Options) ApplyEnv() error {
	if v, ok := os.LookupEnv(EnvCacheSize); ok && v != "" {
		n, err := ParseSize(v)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvCacheSize, err)
		}
		o.CacheSize = n
	}
	if v, ok := os.LookupEnv(EnvBlockSize); ok && v != "" {
		n, err := ParseSize(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%s: %q is not a positive size", EnvBlockSize, v)
		}
		o.BlockSize = n
	}
	if v, ok := os.LookupEnv(EnvUseShm); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%s: %q is not 0/1/true/false", EnvUseShm, v)
		}
		o.Shm = b
	}
	if v, ok := os.LookupEnv(EnvAdmission); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 15 {
			return fmt.Errorf("%s: %q is not a count in [1, 15]", EnvAdmission, v)
		}
		o.AdmissionThreshold = n
	}
	return nil
}

// ParseSize reads "123", "64kb", "16 MiB", "8gb" (powers of 1024).
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: not a number", s)
	}
	mult := map[string]int64{"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
		"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}[strings.TrimSpace(t[i:])]
	if mult == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: unknown unit or too large", s)
	}
	return n * mult, nil
}
