//go:build cgo && fabric

/*
 * Crescent's libfabric shim (internal/fabric). The library is opened at run
 * time with dlopen: the few exported entry points the headers' inline
 * wrappers call are renamed below to forwarders through function pointers,
 * so the binary links only -ldl and starts where libfabric is absent.
 * Everything else in libfabric's API is an inline call through the ops
 * tables of the objects, which works once the objects exist.
 *
 * Hot paths take C arrays (ops, completions) allocated once per endpoint:
 * one call posts a whole batch and reads many completions.
 */
#ifndef CRESCENT_FABRIC_H
#define CRESCENT_FABRIC_H

#define fi_getinfo cf_fi_getinfo
#define fi_freeinfo cf_fi_freeinfo
#define fi_dupinfo cf_fi_dupinfo
#define fi_fabric cf_fi_fabric
#define fi_strerror cf_fi_strerror
#define fi_version cf_fi_version

#include <stddef.h>
#include <stdint.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define CF_ERRLEN 256
#define CF_NAMELEN 64
#define CF_ADDRMAX 256
#define CF_MSGLEN 112

/* One domain (NIC) a provider offers for RDM endpoints with RMA. */
typedef struct {
	char prov[CF_NAMELEN];
	char fabric[CF_NAMELEN];
	char domain[CF_NAMELEN];
	uint64_t mr_mode;
	uint64_t caps;
	uint64_t max_msg;
	uint64_t tx_size;
	uint64_t rx_size;
	int32_t progress; /* data progress: FI_PROGRESS_AUTO or _MANUAL */
	int32_t loopback; /* source address is 127/8 or ::1 */
	int32_t addr_format;
	int32_t src_len;
	uint8_t src[CF_ADDRMAX];
} cf_dominfo;

/* One RMA operation to post. desc is the local MR's descriptor. */
typedef struct {
	uint64_t local;
	uint64_t len;
	void *desc;
	uint64_t peer; /* fi_addr_t */
	uint64_t remote;
	uint64_t key;
	uint32_t slot;
	uint32_t write;
	int32_t rc; /* out: 0 posted, -FI_EAGAIN not posted, other: failed */
	uint32_t pad;
} cf_op;

/* One completion: the op's slot, and for errors the codes and the
 * provider's text (fi_cq_strerror). */
typedef struct {
	uint32_t slot;
	int32_t err;
	int32_t prov_errno;
	int32_t pad;
	char msg[CF_MSGLEN];
} cf_comp;

/* The per-op context (FI_CONTEXT/FI_CONTEXT2 modes need one the provider
 * owns until the completion); id maps a completion back to its slot. */
typedef struct {
	struct fi_context2 ctx;
	uint32_t id;
} cf_slot;

typedef struct {
	uint64_t tx_size;  /* hint; 0 = provider default */
	uint64_t cq_size;
	uint32_t nslots;   /* ops in flight at once */
	uint32_t maxops;   /* ops per post call */
	uint32_t maxcomps; /* completions per call */
	uint32_t av_count;
	int32_t wait_fd;   /* open the CQ with FI_WAIT_FD when possible */
	int32_t delivery;  /* writes complete only once placed at the target */
} cf_opts;

typedef struct cf_ep {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	int wait_fd; /* -1 without a wait object */
	uint32_t nslots, maxops, maxcomps;
	cf_slot *slots;
	cf_op *ops;
	cf_comp *comps;
	uint64_t write_flags;
	uint8_t name[CF_ADDRMAX];
	size_t namelen;
	uint64_t eagain; /* -FI_EAGAIN returned by posts */
} cf_ep;

/* Progress results (out parameters of cf_progress). */
typedef struct {
	int32_t attempted; /* ops[0..attempted) have rc set */
	int32_t posted;
	int32_t ncomp;
	int32_t may_wait; /* fi_trywait said the wait fd may be waited on */
	int32_t err;      /* fi_cq_read error other than EAGAIN, else 0 */
	int32_t eagain;   /* -FI_EAGAIN returns in this call */
} cf_result;

int cf_load(const char *path, char *err, size_t errlen);
int cf_probe(const char *path, char *err, size_t errlen);
uint32_t cf_lib_version(void);
uint32_t cf_api_version(void);
const char *cf_strerror(int code);

int cf_discover(const char *prov, uint64_t tx_size, int delivery, cf_dominfo *out, int max, int *n, char *err, size_t errlen);
int cf_open(const char *prov, const char *domain, const cf_opts *o, cf_ep **out, char *err, size_t errlen);
void cf_close(cf_ep *e);
int cf_ep_close(cf_ep *e);
int cf_ep_open(cf_ep *e, char *err, size_t errlen);

int cf_mr_reg(cf_ep *e, uint64_t addr, uint64_t len, uint64_t key, struct fid_mr **mr, uint64_t *outkey, void **desc);
int cf_mr_close(struct fid_mr *mr);
int cf_av_insert(cf_ep *e, const void *addr, size_t len, uint64_t *out);
int cf_av_remove(cf_ep *e, uint64_t addr);
int cf_cancel(cf_ep *e, uint32_t slot);

void cf_progress(cf_ep *e, int nops, int want_wait, cf_result *r);

#endif
