// restart-load: what a restart of the CRI endpoint costs the kubelet.
//
// It drives a kubelet-like load through the kubelet's own CRI client stack
// (k8s.io/cri-client over grpc-go, as the kubelet dials its
// --container-runtime-endpoint) while it restarts the process serving that
// endpoint, the way systemd does under socket activation: it owns the
// listening socket (as criguard.socket does), passes it to each process as
// fd 3 with LISTEN_FDS=1 and LISTEN_PID, and restarts by SIGTERM, waiting
// for the exit, then starting a new process on the same socket. Connections
// made meanwhile queue in the socket's backlog instead of failing.
//
//	restart-load bench -socket PATH -restarts N [-period 2s] [-logs DIR] [-handoff] [-exec] -- CMD ARGS...
//	restart-load relay -upstream PATH
//
// bench prints one JSON object: calls and failed calls by method, the
// failures' messages, and each restart's drain (SIGTERM to exit) and gap
// (SIGTERM to a fresh connection answered by the new process).
//
// With -handoff a restart is criguard's handoff instead: SIGUSR2 to the
// serving process, which starts its successor on the same sockets and
// exits once its calls in flight are done. bench is the processes'
// subreaper, so the successor becomes its child when the predecessor
// exits; drain is then SIGUSR2 to the predecessor's exit, gap SIGUSR2 to
// a fresh connection answered (by either process). With -exec a
// long-running container in the pod gets ExecSync calls of 2 s back to
// back: calls in flight at every restart.
//
// relay is the baseline: a plain byte relay on the passed socket (or
// -listen PATH), one upstream connection per accepted connection, bytes
// copied both ways. Like socat it knows nothing of HTTP/2, so it cannot
// drain: SIGTERM ends it and every connection with it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: restart-load bench|relay ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "relay":
		relay(os.Args[2:])
	case "bench":
		bench(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "restart-load: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

// relay copies bytes between each accepted connection and a fresh
// connection to -upstream until SIGTERM, which ends it at once.
func relay(args []string) {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	upstream := fs.String("upstream", "", "the runtime's socket")
	listen := fs.String("listen", "", "socket to bind when none is passed (LISTEN_FDS)")
	fs.Parse(args)
	var l net.Listener
	var err error
	if os.Getenv("LISTEN_FDS") == "1" && os.Getenv("LISTEN_PID") == fmt.Sprint(os.Getpid()) {
		l, err = net.FileListener(os.NewFile(3, "listen"))
	} else {
		l, err = net.Listen("unix", *listen)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		os.Exit(0)
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay: accept:", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			u, err := net.Dial("unix", *upstream)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { io.Copy(u, c); u.(*net.UnixConn).CloseWrite(); done <- struct{}{} }()
			go func() { io.Copy(c, u); c.(*net.UnixConn).CloseWrite(); done <- struct{}{} }()
			<-done
			<-done
		}(c)
	}
}

// hexID is a container or sandbox id, left out of the failures' texts so
// that one kind of failure is counted once.
var hexID = regexp.MustCompile(`[0-9a-f]{64}`)

// counts are the calls made and failed, by method, and the failures' texts.
type counts struct {
	mu       sync.Mutex
	Calls    map[string]int `json:"calls"`
	Failed   map[string]int `json:"failed"`
	Messages map[string]int `json:"messages"`
	// Outside counts failures more than -window after every restart's
	// gap ended: a sanity check (a healthy endpoint fails nothing).
	Outside int `json:"failed_outside_restarts"`
}

func (c *counts) add(method string, err error, outside bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Calls[method]++
	if err == nil {
		return
	}
	c.Failed[method]++
	if outside {
		c.Outside++
	}
	s, _ := status.FromError(err)
	msg := hexID.ReplaceAllString(s.Message(), "<id>")
	if len(msg) > 160 {
		msg = msg[:160]
	}
	c.Messages[method+": "+s.Code().String()+": "+msg]++
}

// restart is one restart's timing.
type restart struct {
	DrainMs float64 `json:"drain_ms"`
	GapMs   float64 `json:"gap_ms"`
}

// supervisor owns the listening socket and the serving process.
type supervisor struct {
	file  *os.File
	argv  []string
	log   *os.File
	child *exec.Cmd
	// orphan is a successor adopted after a handoff (child is nil then).
	orphan *os.Process
	exit   chan error
}

func (s *supervisor) start() error {
	args := append([]string{"-c", `export LISTEN_PID=$$ LISTEN_FDS=1; exec "$@"`, "sh"}, s.argv...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.ExtraFiles = []*os.File{s.file}
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		return err
	}
	s.child = cmd
	s.exit = make(chan error, 1)
	go func() { s.exit <- cmd.Wait() }()
	return nil
}

// handoff sends SIGUSR2 to the serving process, waits (up to 60 s) for
// its exit and adopts its successor, the orphan bench is subreaper of.
func (s *supervisor) handoff() error {
	old := s.process().Pid
	s.process().Signal(syscall.SIGUSR2)
	select {
	case err := <-s.exit:
		if err != nil {
			return fmt.Errorf("pid %d after SIGUSR2: %w", old, err)
		}
	case <-time.After(60 * time.Second):
		return fmt.Errorf("pid %d still running 60 s after SIGUSR2", old)
	}
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		for _, pid := range children() {
			if pid == old {
				continue
			}
			p, err := os.FindProcess(pid)
			if err != nil {
				continue
			}
			s.child = nil
			s.exit = make(chan error, 1)
			s.orphan = p
			go func() {
				var ws syscall.WaitStatus
				_, err := syscall.Wait4(pid, &ws, 0, nil)
				if err == nil && !(ws.Exited() && ws.ExitStatus() == 0) {
					err = fmt.Errorf("pid %d: %v", pid, ws)
				}
				s.exit <- err
			}()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no successor of pid %d among bench's children", old)
}

// children are this process's child PIDs (adopted orphans included).
func children() []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// process is the serving process, started or adopted.
func (s *supervisor) process() *os.Process {
	if s.child != nil {
		return s.child.Process
	}
	return s.orphan
}

// stop sends SIGTERM and waits (up to 30 s, then SIGKILL) for the exit.
func (s *supervisor) stop() {
	p := s.process()
	p.Signal(syscall.SIGTERM)
	select {
	case <-s.exit:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(os.Stderr, "bench: no exit 30 s after SIGTERM; SIGKILL")
		p.Kill()
		<-s.exit
	}
}

// probe waits until a fresh connection to socket answers Version.
func probe(socket string, deadline time.Duration) error {
	end := time.Now().Add(deadline)
	for time.Now().Before(end) {
		conn, err := grpc.NewClient("unix://"+socket,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithAuthority("localhost"))
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(end))
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
		cancel()
		conn.Close()
		if err == nil {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("no answer from a fresh connection")
}

func bench(args []string) {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	socket := fs.String("socket", "", "the socket the load dials and the processes serve")
	restarts := fs.Int("restarts", 100, "restarts to make")
	period := fs.Duration("period", 2*time.Second, "load time between a restart's end and the next SIGTERM")
	timeout := fs.Duration("timeout", 2*time.Minute, "per-call timeout (the kubelet's --runtime-request-timeout)")
	logs := fs.String("logs", os.TempDir(), "directory for the processes' output and the pod's logs")
	image := fs.String("image", "docker.io/library/busybox:criguard", "the churned containers' image")
	name := fs.String("name", "restart-load", "label of this run in the output")
	window := fs.Duration("window", 5*time.Second, "after a restart's gap, how long failures still count as the restart's")
	handoff := fs.Bool("handoff", false, "restart by SIGUSR2 (criguard's handoff) instead of SIGTERM and a new process")
	execs := fs.Bool("exec", false, "keep 2 s ExecSync calls in flight in a long-running container")
	fs.Parse(args)
	argv := fs.Args()
	if *socket == "" || len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "usage: restart-load bench -socket PATH [-restarts N] -- CMD ARGS...")
		os.Exit(2)
	}
	os.MkdirAll(*logs, 0o755)
	if *handoff {
		// PR_SET_CHILD_SUBREAPER: a successor whose parent exits is ours.
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, 36, 1, 0); e != 0 {
			fatal(fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %v", e))
		}
	}
	os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		fatal(err)
	}
	// The socket outlives every process, as systemd's does.
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	lf, err := l.(*net.UnixListener).File()
	if err != nil {
		fatal(err)
	}
	out, err := os.OpenFile(filepath.Join(*logs, *name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fatal(err)
	}
	sup := &supervisor{file: lf, argv: argv, log: out}
	if err := sup.start(); err != nil {
		fatal(err)
	}
	defer func() { sup.stop(); l.Close() }()
	if err := probe(*socket, 30*time.Second); err != nil {
		fatal(fmt.Errorf("first start: %w", err))
	}

	ctx := context.Background()
	rs, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint("unix://" + *socket).
		WithConnectionTimeout(*timeout).
		WithTracerProvider(nil).
		Build(ctx)
	if err != nil {
		fatal(err)
	}
	podLogs := filepath.Join(*logs, *name+"-pod")
	os.MkdirAll(podLogs, 0o755)
	uid := fmt.Sprintf("restart-load-%d-%d", os.Getpid(), time.Now().UnixNano())
	sandboxConfig := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: *name, Uid: uid, Namespace: "restart-load"},
		LogDirectory: podLogs,
		Labels: map[string]string{
			"io.kubernetes.pod.name": *name, "io.kubernetes.pod.namespace": "restart-load",
			"io.kubernetes.pod.uid": uid,
		},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE,
					Pid:     runtimeapi.NamespaceMode_POD,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
	sandbox, err := rs.RunPodSandbox(ctx, sandboxConfig, "")
	if err != nil {
		fatal(fmt.Errorf("RunPodSandbox: %w", err))
	}

	c := &counts{Calls: map[string]int{}, Failed: map[string]int{}, Messages: map[string]int{}}
	var (
		mu       sync.Mutex
		quietAt  = time.Now() // failures after this count as outside a restart
		inWindow = false
	)
	outside := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !inWindow && time.Now().After(quietAt)
	}
	call := func(method string, f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		err := f(cctx)
		c.add(method, err, err != nil && outside())
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// A relist's ContainerStatus and the churn's RemoveContainer exclude
	// each other: a container removed between ListContainers and its
	// ContainerStatus is the runtime's right answer (NotFound), not a
	// failed call.
	var listing sync.Mutex
	// The kubelet's PLEG relist, every second, and its pod status reads.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			call("ListPodSandbox", func(ctx context.Context) error {
				_, err := rs.ListPodSandbox(ctx, nil)
				return err
			})
			listing.Lock()
			var ctrs []*runtimeapi.Container
			call("ListContainers", func(ctx context.Context) error {
				var err error
				ctrs, err = rs.ListContainers(ctx, nil)
				return err
			})
			for _, ct := range ctrs {
				if ct.PodSandboxId != sandbox {
					continue
				}
				call("ContainerStatus", func(ctx context.Context) error {
					_, err := rs.ContainerStatus(ctx, ct.Id, false)
					return err
				})
			}
			listing.Unlock()
		}
	}()
	// Container churn in the pod: create, start, stop, remove, again.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for attempt := uint32(0); ; attempt++ {
			select {
			case <-stop:
				return
			default:
			}
			cfg := &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: "churn", Attempt: attempt},
				Image:    &runtimeapi.ImageSpec{Image: *image},
				Command:  []string{"sleep", "3600"},
				LogPath:  fmt.Sprintf("churn_%d.log", attempt),
				Labels: map[string]string{
					"io.kubernetes.container.name": "churn", "io.kubernetes.pod.name": *name,
					"io.kubernetes.pod.namespace": "restart-load", "io.kubernetes.pod.uid": uid,
				},
			}
			var id string
			if call("CreateContainer", func(ctx context.Context) error {
				var err error
				id, err = rs.CreateContainer(ctx, sandbox, cfg, sandboxConfig)
				return err
			}) != nil {
				continue
			}
			call("StartContainer", func(ctx context.Context) error { return rs.StartContainer(ctx, id) })
			time.Sleep(100 * time.Millisecond)
			call("StopContainer", func(ctx context.Context) error { return rs.StopContainer(ctx, id, 0) })
			listing.Lock()
			call("RemoveContainer", func(ctx context.Context) error { return rs.RemoveContainer(ctx, id) })
			listing.Unlock()
		}
	}()

	if *execs {
		execLoad(&wg, stop, rs, sandbox, sandboxConfig, *image, *name, uid, call)
	}

	time.Sleep(*period)
	var times []restart
	for i := 0; i < *restarts; i++ {
		mu.Lock()
		inWindow = true
		mu.Unlock()
		t0 := time.Now()
		var drain, gap time.Duration
		if *handoff {
			// The gap first: a fresh connection answered while the
			// predecessor may still drain.
			probed := make(chan error, 1)
			var answered time.Duration
			go func() {
				// Let the signal land before the first probe.
				time.Sleep(time.Millisecond)
				err := probe(*socket, 60*time.Second)
				answered = time.Since(t0)
				probed <- err
			}()
			if err := sup.handoff(); err != nil {
				fatal(fmt.Errorf("handoff %d: %w", i+1, err))
			}
			drain = time.Since(t0)
			if err := <-probed; err != nil {
				fatal(fmt.Errorf("handoff %d: %w", i+1, err))
			}
			gap = answered
		} else {
			sup.stop()
			drain = time.Since(t0)
			if err := sup.start(); err != nil {
				fatal(err)
			}
			if err := probe(*socket, 60*time.Second); err != nil {
				fatal(fmt.Errorf("restart %d: %w", i+1, err))
			}
			gap = time.Since(t0)
		}
		times = append(times, restart{DrainMs: ms(drain), GapMs: ms(gap)})
		mu.Lock()
		inWindow = false
		quietAt = time.Now().Add(*window)
		mu.Unlock()
		time.Sleep(*period)
	}
	close(stop)
	wg.Wait()
	cleanup(rs, sandbox)

	c.mu.Lock()
	defer c.mu.Unlock()
	calls, failed := 0, 0
	for _, n := range c.Calls {
		calls += n
	}
	for _, n := range c.Failed {
		failed += n
	}
	drains, gaps := make([]float64, 0, len(times)), make([]float64, 0, len(times))
	for _, t := range times {
		drains = append(drains, t.DrainMs)
		gaps = append(gaps, t.GapMs)
	}
	perRestart := 0.0
	if *restarts > 0 {
		perRestart = float64(failed) / float64(*restarts)
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"name":                *name,
		"restarts":            *restarts,
		"calls":               calls,
		"failed":              failed,
		"failed_per_restart":  perRestart,
		"by_method":           c,
		"drain_ms":            summary(drains),
		"gap_ms":              summary(gaps),
		"restart_timings_raw": times,
	})
}

// execLoad runs a long-lived container in the pod and keeps a 2 s ExecSync
// in flight in it until stop: the kubelet's exec probes, long calls that
// every restart finds under way.
func execLoad(wg *sync.WaitGroup, stop chan struct{}, rs internalapi.RuntimeService, sandbox string,
	sandboxConfig *runtimeapi.PodSandboxConfig, image, name, uid string,
	call func(string, func(context.Context) error) error) {
	ctx := context.Background()
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "sleeper"},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  []string{"sleep", "3600"},
		LogPath:  "sleeper.log",
		Labels: map[string]string{
			"io.kubernetes.container.name": "sleeper", "io.kubernetes.pod.name": name,
			"io.kubernetes.pod.namespace": "restart-load", "io.kubernetes.pod.uid": uid,
		},
	}
	id, err := rs.CreateContainer(ctx, sandbox, cfg, sandboxConfig)
	if err != nil {
		fatal(fmt.Errorf("CreateContainer sleeper: %w", err))
	}
	if err := rs.StartContainer(ctx, id); err != nil {
		fatal(fmt.Errorf("StartContainer sleeper: %w", err))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			call("ExecSync", func(ctx context.Context) error {
				_, _, err := rs.ExecSync(ctx, id, []string{"sleep", "2"}, 10*time.Second)
				return err
			})
		}
	}()
}

// cleanup removes the pod's containers and the pod.
func cleanup(rs internalapi.RuntimeService, sandbox string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctrs, _ := rs.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: sandbox})
	for _, ct := range ctrs {
		rs.StopContainer(ctx, ct.Id, 0)
		rs.RemoveContainer(ctx, ct.Id)
	}
	if err := rs.StopPodSandbox(ctx, sandbox); err != nil {
		fmt.Fprintln(os.Stderr, "bench: StopPodSandbox:", err)
	}
	if err := rs.RemovePodSandbox(ctx, sandbox); err != nil {
		fmt.Fprintln(os.Stderr, "bench: RemovePodSandbox:", err)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// summary is p50, p90 and max of xs.
func summary(xs []float64) map[string]float64 {
	if len(xs) == 0 {
		return nil
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	at := func(q float64) float64 { return s[int(q*float64(len(s)-1))] }
	return map[string]float64{"p50": at(0.5), "p90": at(0.9), "max": s[len(s)-1]}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "restart-load:", strings.TrimSpace(err.Error()))
	os.Exit(1)
}
