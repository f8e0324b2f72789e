// hello: a tiny static HTTP server used as a smoke-test image for the kind tooling
// (hack/kind-smoke.sh). On start it appends a line to $DATA_DIR/hello.log, proving the pod can
// write to its volume; GET / returns that file, GET /healthz returns "ok", GET /dns resolves
// the kubernetes Service through the cluster DNS.
package main

import (
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	dir := os.Getenv("DATA_DIR")
	if dir == "" {
		dir = "/data"
	}
	file := filepath.Join(dir, "hello.log")
	host, _ := os.Hostname()
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatalf("open %s: %v", file, err)
	}
	fmt.Fprintf(f, "hello from %s uid=%d at %s\n", host, os.Getuid(), time.Now().UTC().Format(time.RFC3339))
	f.Close()
	log.Printf("wrote %s", file)

	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	http.HandleFunc("/dns", func(w http.ResponseWriter, _ *http.Request) {
		addrs, err := net.LookupHost("kubernetes.default.svc.cluster.local")
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintln(w, addrs)
	})
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		b, err := os.ReadFile(file)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Write(b)
	})
	go func() { log.Fatal(http.ListenAndServe(":8080", nil)) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
