// The collector the OpenTelemetry eBPF profiler needs for the cost bench's
// side-by-side part (bench/cost/peer.rs): an OTLP gRPC profiles receiver
// on 127.0.0.1 that counts what it is sent and keeps nothing. The profiler
// dials its collector before it starts (grpc.WithBlock), so without one it
// would never profile.
//
// Prints `ready PORT`, then, on SIGTERM, `requests N samples M` and exits.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	// The profiler compresses its requests.
	_ "google.golang.org/grpc/encoding/gzip"
)

type sink struct {
	pprofileotlp.UnimplementedGRPCServer
	requests, samples atomic.Int64
}

func (s *sink) Export(_ context.Context, req pprofileotlp.ExportRequest) (pprofileotlp.ExportResponse, error) {
	s.requests.Add(1)
	s.samples.Add(int64(req.Profiles().SampleCount()))
	return pprofileotlp.NewExportResponse(), nil
}

func main() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The profiler's messages reach 40 MiB on a busy host.
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	s := &sink{}
	pprofileotlp.RegisterGRPCServer(srv, s)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		srv.Stop()
	}()
	fmt.Printf("ready %d\n", lis.Addr().(*net.TCPAddr).Port)
	_ = srv.Serve(lis)
	fmt.Printf("requests %d samples %d\n", s.requests.Load(), s.samples.Load())
}
