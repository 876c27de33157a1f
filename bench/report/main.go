// Command report joins the results of the benchmarks under bench/ into one
// Markdown report, <out>/report.md: a header naming the machine, each
// benchmark's command and date and every plot, then each benchmark's own
// Markdown (<out>/<name>.md) with its headings one level down. Plots are
// linked by file name, so the report works where it is written.
//
// Usage:
//
//	go run ./bench/report [-out bench/results] [-benchmarks transport,fileops]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weir-storage/weir/bench/internal/benchutil"
)

// section is what the report needs of one benchmark's results.
type section struct {
	Name     string
	Markdown string
	// From <name>.json; every benchmark writes these fields.
	Date    string         `json:"date"`
	Command string         `json:"command"`
	Host    benchutil.Host `json:"host"`
	Plots   []string       `json:"plots"`
}

func main() {
	logger := log.New(os.Stderr, "report: ", 0)
	out := flag.String("out", "bench/results", "directory holding each benchmark's <name>.md and <name>.json; report.md is written there")
	names := flag.String("benchmarks", "transport,fileops", "comma-separated benchmarks, in report order")
	flag.Parse()
	if flag.NArg() > 0 {
		logger.Printf("unexpected arguments %q", flag.Args())
		os.Exit(2)
	}
	secs, err := load(*out, strings.Split(*names, ","))
	if err != nil {
		logger.Print(err)
		os.Exit(1)
	}
	path := filepath.Join(*out, "report.md")
	if err := benchutil.WriteFileAtomic(path, []byte(render(secs, *out, time.Now()))); err != nil {
		logger.Print(err)
		os.Exit(1)
	}
	logger.Printf("wrote %s (%s)", path, strings.Join(sectionNames(secs), ", "))
}

// load reads every benchmark's results; a missing one is an error naming
// the make target that writes it.
func load(dir string, names []string) ([]section, error) {
	var secs []section
	var errs []error
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		md, err := os.ReadFile(filepath.Join(dir, n+".md"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				err = fmt.Errorf("no results of %s in %s: run `make bench-%s` (or `make bench`) first", n, dir, n)
			}
			errs = append(errs, err)
			continue
		}
		s := section{Name: n, Markdown: string(md)}
		if js, err := os.ReadFile(filepath.Join(dir, n+".json")); err == nil {
			if err := json.Unmarshal(js, &s); err != nil {
				errs = append(errs, fmt.Errorf("%s.json: %w", n, err))
				continue
			}
		}
		secs = append(secs, s)
	}
	if len(secs) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no benchmarks named"))
	}
	return secs, errors.Join(errs...)
}

func sectionNames(secs []section) []string {
	var ns []string
	for _, s := range secs {
		ns = append(ns, s.Name)
	}
	return ns
}

// render builds report.md. Plots that are not in dir are left out.
func render(secs []section, dir string, now time.Time) string {
	var b strings.Builder
	b.WriteString("# weir benchmark report\n\n")
	fmt.Fprintf(&b, "- Generated: %s\n", now.UTC().Format(time.RFC3339))
	if h := secs[0].Host; h.NProc > 0 {
		fmt.Fprintf(&b, "- Machine: %d CPUs (nproc), %s; %s; %s\n", h.NProc, h.CPUModel, h.Kernel, h.GoVersion)
	}
	b.WriteString("- Benchmarks:\n")
	for _, s := range secs {
		fmt.Fprintf(&b, "  - %s: `%s`, %s\n", s.Name, s.Command, s.Date)
	}
	var plots []string
	for _, s := range secs {
		for _, p := range s.Plots {
			if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
				plots = append(plots, fmt.Sprintf("[%s](%s)", p, p))
			}
		}
	}
	if len(plots) > 0 {
		fmt.Fprintf(&b, "- Plots: %s\n", strings.Join(plots, ", "))
	}
	b.WriteString("\n")
	for _, s := range secs {
		b.WriteString(demote(s.Markdown))
		if !strings.HasSuffix(s.Markdown, "\n") {
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// demote moves every Markdown heading one level down, so each benchmark's
// title becomes a section of the report.
func demote(md string) string {
	lines := strings.Split(md, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			lines[i] = "#" + l
		}
	}
	return strings.Join(lines, "\n")
}
