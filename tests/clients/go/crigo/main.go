// Command crigo is a kubelet-like CRI client (and a grpc-go recording
// upstream) for criguard's tests and benchmarks, built with Debian's grpc-go
// and no generated code: messages travel as raw bytes.
//
// Usage:
//
//	crigo client TARGET           JSON lines on stdin, answers on stdout
//	crigo bench [flags] TARGET... N calls of one method, targets alternated
//	crigo echo --listen PATH      a grpc-go server that records and echoes
//
// A TARGET that is a bare path is dialled the way kubelets before 2024 dial
// their runtime (passthrough resolver and a unix dialer, so :authority is the
// socket path); a unix:// target is given to grpc as it is (:authority
// "localhost").
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// rawCodec passes messages through as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	// Never nil: JSON would say null for an empty message.
	*b = make([]byte, len(data))
	copy(*b, data)
	return nil
}

// Name is "proto", so the content-type stays application/grpc.
func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// maxMsg is the kubelet's CRI message limit (16 MiB).
const maxMsg = 16 << 20

// dial connects to target as described in the package comment.
func dial(target string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
	}
	if !strings.HasPrefix(target, "unix:") {
		// The kubelet's util.GetAddressAndDialer: the address is the path.
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	}
	return grpc.DialContext(ctx, target, opts...)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: crigo client TARGET | crigo bench [--n N] [--warmup W] --method M --req BASE64 TARGET... | crigo echo --listen PATH")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "client":
		if len(os.Args) != 3 {
			usage()
		}
		err = runClient(os.Args[2])
	case "bench":
		err = runBench(os.Args[2:])
	case "echo":
		err = runEcho(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crigo:", err)
		os.Exit(1)
	}
}
