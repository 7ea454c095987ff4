package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A recording upstream that stands in for containerd's gRPC server (which is
// grpc-go too): it accepts what grpc-go accepts, any :authority included,
// prints every call it receives as a JSON line on stdout, and answers as the
// call's own metadata asks:
//
//	x-echo-reply    base64 of the reply message (default: the request bytes)
//	x-echo-header   sent back as header x-echo-header and trailer x-echo-trailer
//	x-echo-code     a gRPC status code to fail with (no message sent)
//	x-echo-message  base64 of the status message that goes with it
//	x-echo-stream   N: answer with N messages, message i being the reply
//	                followed by field 15 (varint i)
//	x-echo-gate     TAG: before each streamed message, wait for a line
//	                "release TAG" on stdin
//
// Metadata keys starting with x-echo- are the test's, all others are
// recorded untouched.

// seen is one recorded call.
type seen struct {
	Method string      `json:"method"`
	MD     [][2]string `json:"md"`
	Req    []byte      `json:"req"`
}

// gates hands out one release per "release TAG" line.
type gates struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (g *gates) get(tag string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.ch[tag]
	if !ok {
		c = make(chan struct{}, 1024)
		g.ch[tag] = c
	}
	return c
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func runEcho(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	listen := fs.String("listen", "", "unix socket path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen == "" {
		return fmt.Errorf("echo needs --listen PATH")
	}
	lis, err := net.Listen("unix", *listen)
	if err != nil {
		return err
	}
	o := &out{enc: json.NewEncoder(os.Stdout)}
	g := &gates{ch: map[string]chan struct{}{}}
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			var tag string
			if _, err := fmt.Sscanf(in.Text(), "release %s", &tag); err == nil {
				g.get(tag) <- struct{}{}
			}
		}
		// The test is gone: so are we.
		os.Exit(0)
	}()
	handler := func(_ interface{}, ss grpc.ServerStream) error {
		return echo(ss, o, g)
	}
	srv := grpc.NewServer(grpc.CustomCodec(rawCodec{}), grpc.UnknownServiceHandler(handler),
		grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg))
	o.write(map[string]bool{"ready": true})
	return srv.Serve(lis)
}

func echo(ss grpc.ServerStream, o *out, g *gates) error {
	method, _ := grpc.MethodFromServerStream(ss)
	md, _ := metadata.FromIncomingContext(ss.Context())
	var req []byte
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	o.write(&seen{Method: method, MD: pairs(md), Req: req})
	reply := req
	if r := first(md, "x-echo-reply"); r != "" {
		b, err := base64.StdEncoding.DecodeString(r)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "x-echo-reply: %v", err)
		}
		reply = b
	}
	if h := first(md, "x-echo-header"); h != "" {
		if err := ss.SetHeader(metadata.Pairs("x-echo-header", h)); err != nil {
			return err
		}
		ss.SetTrailer(metadata.Pairs("x-echo-trailer", h))
	}
	if c := first(md, "x-echo-code"); c != "" {
		code, err := strconv.Atoi(c)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "x-echo-code %q: %v", c, err)
		}
		msg, err := base64.StdEncoding.DecodeString(first(md, "x-echo-message"))
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "x-echo-message: %v", err)
		}
		return status.Error(codes.Code(code), string(msg))
	}
	n := 0
	if s := first(md, "x-echo-stream"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			return status.Errorf(codes.InvalidArgument, "x-echo-stream %q: %v", s, err)
		}
	} else {
		return ss.SendMsg(&reply)
	}
	gate := first(md, "x-echo-gate")
	for i := 0; i < n; i++ {
		if gate != "" {
			select {
			case <-g.get(gate):
			case <-ss.Context().Done():
				return ss.Context().Err()
			}
		}
		m := append(append([]byte(nil), reply...), 0x78, byte(i))
		if err := ss.SendMsg(&m); err != nil {
			return err
		}
	}
	return nil
}
