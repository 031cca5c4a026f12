package fleetsim

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// dumpRecords (scratch, cells20): with FLEETSIM_RECORDS=dir, every run's
// records go to dir/<policy>-<workload>-<salt>.csv.
func dumpRecords(cfg Config, res *Result) {
	dir := os.Getenv("FLEETSIM_RECORDS")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", ":", "_", " ", "_").Replace(fmt.Sprintf("%s-%s-%d.csv", res.Policy, res.Workload, cfg.Salt))
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()
	for i, e := range res.Engine {
		fmt.Fprintf(w, "#eng %d preempt=%d steps=%d queries=%d hits=%d prompt=%d\n", i, e.Preemptions, e.Steps, e.PrefixQueries, e.PrefixHits, e.PromptTokens)
	}
	fmt.Fprintln(w, "id,rep,sent,first,done,prompt,cached,output,session,turn,group,err")
	for _, r := range res.Records {
		row := cfg.Workload.Trace[r.ID]
		fmt.Fprintf(w, "%d,%d,%.4f,%.4f,%.4f,%d,%d,%d,%d,%d,%d,%s\n", r.ID, r.Replica, r.Sent, r.First, r.Done, r.Prompt, r.Cached, r.Output, row.Session, row.Turn, row.Group, r.Err)
	}
}
