package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be its own server child, as the program is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == serverRoleArg {
		os.Exit(serverMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func frame(op, n uint32, payload []byte) []byte {
	b := make([]byte, frameHeaderLen, frameHeaderLen+len(payload))
	putFrameHeader(b, op, n)
	return append(b, payload...)
}

func TestReadFrame(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, 100)
	tests := []struct {
		name    string
		in      []byte
		wantOp  uint32
		wantLen int
		wantErr bool
	}{
		{"no-op", frame(opNop, 0, nil), opNop, 0, false},
		{"echo", frame(opEcho, 100, payload), opEcho, 100, false},
		{"short header", frame(opNop, 0, nil)[:5], 0, 0, true},
		{"short payload", frame(opEcho, 100, payload[:40]), 0, 0, true},
		{"oversized", frame(opEcho, maxFramePayload+1, nil), 0, 0, true},
		{"bytes beyond the frame", frame(opEcho, 10, payload[:20]), 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op, p, err := readFrame(bytes.NewReader(tc.in), make([]byte, frameBufLen))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("readFrame = op %d, %d bytes; want an error", op, len(p))
				}
				return
			}
			if err != nil || op != tc.wantOp || len(p) != tc.wantLen {
				t.Fatalf("readFrame = op %d, %d bytes, %v; want op %d, %d bytes", op, len(p), err, tc.wantOp, tc.wantLen)
			}
		})
	}
	if _, _, err := readFrame(bytes.NewReader(nil), make([]byte, frameBufLen)); !errors.Is(err, io.EOF) {
		t.Errorf("readFrame on an empty stream = %v, want io.EOF", err)
	}
}

// TestRunSmoke runs every transport for a few milliseconds per
// configuration and checks the report is complete. It asserts no timings.
func TestRunSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process per transport")
	}
	cfg := config{
		out:        t.TempDir(),
		transports: allTransports,
		threads:    []int{1, 2},
		payloads:   []int{0, echoPayload},
		s:          settings{warmup: 10 * time.Millisecond, window: 20 * time.Millisecond, maxSamples: 1000},
	}
	logger := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		logger = log.New(os.Stderr, "transport: ", 0)
	}
	rep, err := run(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	wantRows := len(cfg.transports) * (len(cfg.payloads)*len(cfg.threads) + 1)
	if len(rep.Rows) != wantRows {
		t.Fatalf("%d rows, want %d", len(rep.Rows), wantRows)
	}
	for _, row := range rep.Rows {
		if row.Error != "" {
			t.Errorf("%s %s ×%d: %s", row.Transport, row.Workload, row.Threads, row.Error)
			continue
		}
		if row.Idle {
			continue
		}
		if row.Ops == 0 || row.Samples == 0 || row.P50us <= 0 || row.P50us > row.P999us {
			t.Errorf("%s %s ×%d: ops %d, samples %d, p50 %v, p99.9 %v", row.Transport, row.Workload, row.Threads,
				row.Ops, row.Samples, row.P50us, row.P999us)
		}
		if isRing(row.Transport) && (row.P50LowerThanUDS == nil || row.OpsVsUDS == nil) {
			t.Errorf("%s %s ×%d: no ratio against uds", row.Transport, row.Workload, row.Threads)
		}
	}
	if rep.Goal.Met == nil || rep.Goal.MetVsBlocking == nil {
		t.Errorf("goal not judged: %s", rep.Goal.Note)
	}

	md := rep.markdown()
	if err := rep.write(cfg.out, md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| Workload | Threads | Transport |", "| no-op | 1 | ring-busypoll |", "**Goal (issue 2):**"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	js, err := os.ReadFile(filepath.Join(cfg.out, "transport.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("transport.json: %v", err)
	}
	if len(back.Rows) != wantRows || back.Host.NProc <= 0 || back.Host.GoVersion == "" {
		t.Errorf("transport.json: %d rows, host %+v", len(back.Rows), back.Host)
	}
}
