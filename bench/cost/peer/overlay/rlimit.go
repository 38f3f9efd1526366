// Copyright The OpenTelemetry Authors
// SPDX-License-Identifier: Apache-2.0

// The cost bench's replacement for the pinned module's rlimit/rlimit.go
// (go build -overlay, bench/cost/peer.rs): where raising RLIMIT_MEMLOCK is
// not permitted (a container without CAP_SYS_RESOURCE), it carries on
// with the limit as it is, as wallscope does: kernels since 5.11 charge
// BPF memory to the memory cgroup, not to RLIMIT_MEMLOCK. Otherwise the
// same as upstream's.
package rlimit // import "go.opentelemetry.io/ebpf-profiler/rlimit"

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"go.opentelemetry.io/ebpf-profiler/internal/log"
)

// MaximizeMemlock updates the memlock resource limit to RLIM_INFINITY.
// It returns a function to reset the resource limit to its original value or an error.
func MaximizeMemlock() (func(), error) {
	var oldLimit unix.Rlimit
	tmpLimit := unix.Rlimit{
		Cur: unix.RLIM_INFINITY,
		Max: unix.RLIM_INFINITY,
	}

	if err := unix.Prlimit(0, unix.RLIMIT_MEMLOCK, &tmpLimit, &oldLimit); err != nil {
		if errors.Is(err, unix.EPERM) {
			return func() {}, nil
		}
		return nil, fmt.Errorf("failed to set temporary rlimit: %w", err)
	}

	return func() {
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &oldLimit); err != nil {
			// TODO: Used to be log.Fatalf, revisit with error propagation if needed
			log.Errorf("Failed to set old rlimit: %v", err)
		}
	}, nil
}
