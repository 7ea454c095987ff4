package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// call is one request line on stdin.
type call struct {
	ID        uint64      `json:"id"`
	Method    string      `json:"method"`
	Req       []byte      `json:"req"`
	MD        [][2]string `json:"md"`
	TimeoutMs int64       `json:"timeout_ms"`
	Stream    bool        `json:"stream"`
}

// event is one message of a server stream, reported as it arrives.
type event struct {
	ID  uint64 `json:"id"`
	Msg []byte `json:"msg"`
}

// answer is the final line for a call (a stream's events come first).
type answer struct {
	ID      uint64      `json:"id"`
	Done    bool        `json:"done"`
	Code    int         `json:"code"`
	Message string      `json:"message"`
	Msgs    [][]byte    `json:"msgs"`
	Header  [][2]string `json:"header"`
	Trailer [][2]string `json:"trailer"`
	Micros  int64       `json:"micros"`
}

// pairs flattens metadata into sorted (key, value) pairs.
func pairs(md metadata.MD) [][2]string {
	out := [][2]string{}
	for k, vs := range md {
		for _, v := range vs {
			out = append(out, [2]string{k, v})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}

// out serialises writes of JSON lines from concurrent calls.
type out struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *out) write(v interface{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "crigo: stdout:", err)
		os.Exit(1)
	}
}

func runClient(target string) error {
	cc, err := dial(target)
	if err != nil {
		return err
	}
	defer cc.Close()
	o := &out{enc: json.NewEncoder(os.Stdout)}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	var wg sync.WaitGroup
	for in.Scan() {
		var c call
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			return fmt.Errorf("bad request line %q: %v", in.Text(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.write(do(cc, &c, o))
		}()
	}
	wg.Wait()
	return in.Err()
}

// do makes one call and returns its final answer line.
func do(cc *grpc.ClientConn, c *call, o *out) *answer {
	ctx := context.Background()
	if c.TimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(c.TimeoutMs)*time.Millisecond)
		defer cancel()
	}
	for _, kv := range c.MD {
		ctx = metadata.AppendToOutgoingContext(ctx, kv[0], kv[1])
	}
	var header, trailer metadata.MD
	opts := []grpc.CallOption{grpc.ForceCodec(rawCodec{}), grpc.Header(&header), grpc.Trailer(&trailer)}
	a := &answer{ID: c.ID, Done: true, Msgs: [][]byte{}}
	start := time.Now()
	var err error
	if c.Stream {
		err = stream(ctx, cc, c, opts, a, o)
	} else {
		var reply []byte
		err = cc.Invoke(ctx, c.Method, &c.Req, &reply, opts...)
		if err == nil {
			a.Msgs = append(a.Msgs, reply)
		}
	}
	a.Micros = time.Since(start).Microseconds()
	st := status.Convert(err)
	a.Code, a.Message = int(st.Code()), st.Message()
	a.Header, a.Trailer = pairs(header), pairs(trailer)
	return a
}

// stream makes a server-streaming call, reporting each message as it comes.
func stream(ctx context.Context, cc *grpc.ClientConn, c *call, opts []grpc.CallOption, a *answer, o *out) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, c.Method, opts...)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&c.Req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		var m []byte
		err := s.RecvMsg(&m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		a.Msgs = append(a.Msgs, m)
		o.write(&event{ID: c.ID, Msg: m})
	}
}

// runBench makes n calls per target, the targets alternated call by call
// (the first target rotating), and prints "TARGET_INDEX NANOSECONDS" lines.
func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	n := fs.Int("n", 1000, "timed calls per target")
	warmup := fs.Int("warmup", 20, "untimed calls per target first")
	method := fs.String("method", "", "full method path")
	req := fs.String("req", "", "request message, base64")
	if err := fs.Parse(args); err != nil {
		return err
	}
	body, err := base64.StdEncoding.DecodeString(*req)
	if err != nil || *method == "" || fs.NArg() == 0 {
		return fmt.Errorf("bench needs --method, a base64 --req and targets")
	}
	conns := make([]*grpc.ClientConn, fs.NArg())
	for i, t := range fs.Args() {
		if conns[i], err = dial(t); err != nil {
			return err
		}
	}
	one := func(cc *grpc.ClientConn) error {
		var reply []byte
		return cc.Invoke(context.Background(), *method, &body, &reply, grpc.ForceCodec(rawCodec{}))
	}
	for i := 0; i < *warmup; i++ {
		for _, cc := range conns {
			if err := one(cc); err != nil {
				return err
			}
		}
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	times := make([]int64, 0, *n*len(conns))
	for i := 0; i < *n; i++ {
		for k := range conns {
			t := (i + k) % len(conns)
			start := time.Now()
			if err := one(conns[t]); err != nil {
				return fmt.Errorf("target %d: %v", t, err)
			}
			times = append(times, int64(t), time.Since(start).Nanoseconds())
		}
	}
	for i := 0; i < len(times); i += 2 {
		fmt.Fprintf(w, "%d %d\n", times[i], times[i+1])
	}
	return nil
}
