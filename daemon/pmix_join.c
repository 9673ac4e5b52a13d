/* pmix_join: see pmix_join.h. */
#include "daemon/pmix_join.h"

#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"

/* the widths in get's sscanf */
_Static_assert(MSG_ADDR_MAX == 80 && MSG_SECRET_BYTES == 32, "get() reads %79s and %64s");

static pmix_proc_t self;
static int initialised;

int pmix_join_active(void) {
    const char *ns = getenv("PMIX_NAMESPACE");
    return ns && *ns;
}

static void finalise(void) { PMIx_Finalize(NULL, 0); }

static int init_once(int node, errbuf *err) {
    if (!initialised) {
        pmix_status_t rc = PMIx_Init(&self, NULL, 0);
        if (rc != PMIX_SUCCESS) return errf(err, "PMIx_Init: %s", PMIx_Error_string(rc));
        initialised = 1;
        atexit(finalise);
    }
    if ((int)self.rank != node)
        return errf(err, "PMIx rank %u is not this node's index %d: run one fsdpd per node (srun "
                    "--ntasks-per-node=1)", self.rank, node);
    return 0;
}

static void key_name(char *out, size_t n, int attempt) { snprintf(out, n, "fsdpd.leader.a%d", attempt); }

static int put(const pmix_join_endpoint *ep, int attempt, errbuf *err) {
    char key[PMIX_MAX_KEYLEN + 1], text[sizeof ep->host + 16 + sizeof ep->secret_hex];
    key_name(key, sizeof key, attempt);
    snprintf(text, sizeof text, "%s %d %s", ep->host, ep->port, ep->secret_hex);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    pmix_status_t rc = PMIx_Value_load(&v, text, PMIX_STRING);
    if (rc == PMIX_SUCCESS) rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    PMIX_VALUE_DESTRUCT(&v);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return errf(err, "PMIx: publishing the leader's address: %s", PMIx_Error_string(rc));
    return 0;
}

static int fence(int timeout_s, errbuf *err) {
    pmix_info_t info[2];
    bool collect = true;
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    pmix_status_t rc = PMIx_Info_load(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if (rc == PMIX_SUCCESS) rc = PMIx_Info_load(&info[1], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    if (rc == PMIX_SUCCESS) rc = PMIx_Fence(NULL, 0, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc != PMIX_SUCCESS)
        return errf(err, "PMIx_Fence (every node, at most runtime.join_timeout_s = %d s): %s", timeout_s,
                    PMIx_Error_string(rc));
    return 0;
}

static int get(pmix_join_endpoint *ep, int attempt, errbuf *err) {
    char key[PMIX_MAX_KEYLEN + 1];
    key_name(key, sizeof key, attempt);
    pmix_proc_t leader;
    PMIX_PROC_LOAD(&leader, self.nspace, 0);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&leader, key, NULL, 0, &v);
    if (rc != PMIX_SUCCESS) return errf(err, "PMIx_Get %s of rank 0: %s", key, PMIx_Error_string(rc));
    int ok = v->type == PMIX_STRING && v->data.string &&
             sscanf(v->data.string, "%79s %d %64s", ep->host, &ep->port, ep->secret_hex) == 3 &&
             ep->port > 0 && ep->port < 65536 && strlen(ep->secret_hex) == 2 * MSG_SECRET_BYTES;
    PMIX_VALUE_RELEASE(v);
    if (!ok) return errf(err, "PMIx: rank 0's %s is not \"HOST PORT SECRET\"", key);
    return 0;
}

int pmix_join_lead(const char *host, int port, const char *secret_hex, int attempt, int timeout_s, errbuf *err) {
    pmix_join_endpoint ep = {.port = port};
    if (snprintf(ep.host, sizeof ep.host, "%s", host) >= (int)sizeof ep.host ||
        snprintf(ep.secret_hex, sizeof ep.secret_hex, "%s", secret_hex) >= (int)sizeof ep.secret_hex)
        return errf(err, "the rendezvous through PMIx: the address or the secret is too long");
    if (init_once(0, err) || put(&ep, attempt, err) || fence(timeout_s, err))
        return errprefix(err, "the rendezvous through PMIx");
    log_event(-1, "PMIx: published the leader's address and the job secret (namespace %s)", self.nspace);
    return 0;
}

int pmix_join_follow(pmix_join_endpoint *ep, int node, int attempt, int timeout_s, errbuf *err) {
    if (node < 1) return errf(err, "the rendezvous through PMIx: node %d is no follower", node);
    if (init_once(node, err) || fence(timeout_s, err) || get(ep, attempt, err))
        return errprefix(err, "the rendezvous through PMIx");
    log_event(-1, "PMIx: the leader is at %s:%d (namespace %s)", ep->host, ep->port, self.nspace);
    return 0;
}
