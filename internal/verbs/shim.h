// C side of internal/verbs: libibverbs loaded with dlopen, the exported
// calls resolved into function pointers, and batch helpers so that one
// cgo crossing posts a chain of work requests or polls a batch of
// completions. The data-path calls (ibv_post_send, ibv_poll_cq,
// ibv_req_notify_cq) are libibverbs' static inline wrappers over the
// provider's ops table; they work on the objects the library returned.
// Nothing here blocks: the completion channel fd is non-blocking and Go
// waits for it in its netpoller.
#ifndef CRESCENT_VERBS_SHIM_H
#define CRESCENT_VERBS_SHIM_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

typedef struct cv_lib {
	void *handle;
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
} cv_lib;

// cv_load opens the library and resolves every symbol; on failure it
// returns NULL and the reason in err.
static cv_lib *cv_load(const char *name, char *err, size_t errlen) {
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	cv_lib *l = calloc(1, sizeof *l);
	if (!l) {
		dlclose(h);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->handle = h;
#define CV_SYM(field, sym)                                                   \
	do {                                                                 \
		*(void **)(&l->field) = dlsym(h, sym);                       \
		if (!l->field) {                                             \
			snprintf(err, errlen, "%s: symbol %s not found", name, sym); \
			dlclose(h);                                          \
			free(l);                                             \
			return NULL;                                         \
		}                                                            \
	} while (0)
	CV_SYM(get_device_list, "ibv_get_device_list");
	CV_SYM(free_device_list, "ibv_free_device_list");
	CV_SYM(get_device_name, "ibv_get_device_name");
	CV_SYM(open_device, "ibv_open_device");
	CV_SYM(close_device, "ibv_close_device");
	CV_SYM(query_device, "ibv_query_device");
	CV_SYM(query_port, "ibv_query_port");
	CV_SYM(query_gid, "ibv_query_gid");
	CV_SYM(alloc_pd, "ibv_alloc_pd");
	CV_SYM(dealloc_pd, "ibv_dealloc_pd");
	CV_SYM(reg_mr, "ibv_reg_mr");
	CV_SYM(dereg_mr, "ibv_dereg_mr");
	CV_SYM(create_comp_channel, "ibv_create_comp_channel");
	CV_SYM(destroy_comp_channel, "ibv_destroy_comp_channel");
	CV_SYM(create_cq, "ibv_create_cq");
	CV_SYM(destroy_cq, "ibv_destroy_cq");
	CV_SYM(get_cq_event, "ibv_get_cq_event");
	CV_SYM(ack_cq_events, "ibv_ack_cq_events");
	CV_SYM(create_qp, "ibv_create_qp");
	CV_SYM(modify_qp, "ibv_modify_qp");
	CV_SYM(query_qp, "ibv_query_qp");
	CV_SYM(destroy_qp, "ibv_destroy_qp");
#undef CV_SYM
	return l;
}

static void cv_unload(cv_lib *l) {
	if (l->handle)
		dlclose(l->handle);
	free(l);
}

static int cv_errno(void) { return errno ? errno : EIO; }

// cv_device_list returns the number of devices (list in *out), or
// -errno when the library could not list them.
static int cv_device_list(cv_lib *l, struct ibv_device ***out) {
	int n = 0;
	errno = 0;
	*out = l->get_device_list(&n);
	if (!*out)
		return -cv_errno();
	return n;
}

static void cv_free_device_list(cv_lib *l, struct ibv_device **list) { l->free_device_list(list); }

static int cv_close_device(cv_lib *l, struct ibv_context *ctx) { return l->close_device(ctx); }

static int cv_dealloc_pd(cv_lib *l, struct ibv_pd *pd) { return l->dealloc_pd(pd); }

static int cv_dereg_mr(cv_lib *l, struct ibv_mr *mr) { return l->dereg_mr(mr); }

static const char *cv_device_name(cv_lib *l, struct ibv_device **list, int i) {
	return l->get_device_name(list[i]);
}

static int cv_device_transport(struct ibv_device **list, int i) { return (int)list[i]->transport_type; }

static struct ibv_context *cv_open_device(cv_lib *l, struct ibv_device **list, int i, int *err) {
	errno = 0;
	struct ibv_context *c = l->open_device(list[i]);
	if (!c)
		*err = cv_errno();
	return c;
}

typedef struct {
	int ports, max_qp_rd_atom, max_qp_init_rd_atom, max_qp_wr, max_cqe;
} cv_devattr;

static int cv_query_device(cv_lib *l, struct ibv_context *ctx, cv_devattr *out) {
	struct ibv_device_attr a;
	memset(&a, 0, sizeof a);
	int rc = l->query_device(ctx, &a);
	if (rc)
		return rc;
	out->ports = a.phys_port_cnt;
	out->max_qp_rd_atom = a.max_qp_rd_atom;
	out->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	out->max_qp_wr = a.max_qp_wr;
	out->max_cqe = a.max_cqe;
	return 0;
}

typedef struct {
	int state, max_mtu, active_mtu, lid, link_layer, gid_tbl_len;
} cv_port;

// cv_query_port is libibverbs' ___ibv_query_port with the exported
// fallback called through the resolved pointer.
static int cv_query_port(cv_lib *l, struct ibv_context *ctx, uint8_t port, cv_port *out) {
	struct ibv_port_attr a;
	memset(&a, 0, sizeof a);
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
	int rc;
	if (!vctx)
		rc = l->query_port(ctx, port, (struct _compat_ibv_port_attr *)&a);
	else
		rc = vctx->query_port(ctx, port, &a, sizeof a);
	if (rc)
		return rc;
	out->state = a.state;
	out->max_mtu = a.max_mtu;
	out->active_mtu = a.active_mtu;
	out->lid = a.lid;
	out->link_layer = a.link_layer;
	out->gid_tbl_len = a.gid_tbl_len;
	return 0;
}

static int cv_query_gid(cv_lib *l, struct ibv_context *ctx, uint8_t port, int index, uint8_t *out16) {
	union ibv_gid g;
	int rc = l->query_gid(ctx, port, index, &g);
	if (rc)
		return rc;
	memcpy(out16, g.raw, 16);
	return 0;
}

static struct ibv_pd *cv_alloc_pd(cv_lib *l, struct ibv_context *ctx, int *err) {
	errno = 0;
	struct ibv_pd *p = l->alloc_pd(ctx);
	if (!p)
		*err = cv_errno();
	return p;
}

static struct ibv_mr *cv_reg_mr(cv_lib *l, struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err) {
	errno = 0;
	struct ibv_mr *m = l->reg_mr(pd, (void *)addr, len, access);
	if (!m)
		*err = cv_errno();
	return m;
}

static uint32_t cv_mr_lkey(struct ibv_mr *m) { return m->lkey; }
static uint32_t cv_mr_rkey(struct ibv_mr *m) { return m->rkey; }

// Completions are copied into this flat layout, so Go never depends on
// struct ibv_wc.
typedef struct {
	uint64_t wr_id;
	uint32_t status, opcode, byte_len, qp_num, vendor_err;
} cv_wc;

typedef struct {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_wc *raw;
	cv_wc *out;
	int cap;
	int owned; // created here (destroyed on close)
} cv_cq;

static cv_cq *cv_create_cq(cv_lib *l, struct ibv_context *ctx, int depth, int cap, int *err) {
	cv_cq *c = calloc(1, sizeof *c);
	if (!c) {
		*err = ENOMEM;
		return NULL;
	}
	c->owned = 1;
	c->cap = cap;
	c->raw = calloc(cap, sizeof *c->raw);
	c->out = calloc(cap, sizeof *c->out);
	if (!c->raw || !c->out) {
		*err = ENOMEM;
		goto fail;
	}
	errno = 0;
	c->ch = l->create_comp_channel(ctx);
	if (!c->ch) {
		*err = cv_errno();
		goto fail;
	}
	int fl = fcntl(c->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(c->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		*err = cv_errno();
		l->destroy_comp_channel(c->ch);
		goto fail;
	}
	errno = 0;
	c->cq = l->create_cq(ctx, depth, NULL, c->ch, 0);
	if (!c->cq) {
		*err = cv_errno();
		l->destroy_comp_channel(c->ch);
		goto fail;
	}
	return c;
fail:
	free(c->raw);
	free(c->out);
	free(c);
	return NULL;
}

static int cv_cq_fd(cv_cq *c) { return c->ch->fd; }

// cv_poll polls up to n completions into c->out; it returns their number
// or -1 on a CQ error.
static int cv_poll(cv_cq *c, int n) {
	if (n > c->cap)
		n = c->cap;
	int k = ibv_poll_cq(c->cq, n, c->raw);
	for (int i = 0; i < k; i++) {
		struct ibv_wc *w = &c->raw[i];
		cv_wc *o = &c->out[i];
		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->byte_len = w->byte_len;
		o->qp_num = w->qp_num;
		o->vendor_err = w->vendor_err;
	}
	return k;
}

static int cv_arm(cv_cq *c) { return ibv_req_notify_cq(c->cq, 0); }

// cv_get_event takes one event off the non-blocking channel and acks it:
// 0, or EAGAIN when none is ready, or another errno.
static int cv_get_event(cv_lib *l, cv_cq *c) {
	struct ibv_cq *cq = NULL;
	void *ctx = NULL;
	errno = 0;
	if (l->get_cq_event(c->ch, &cq, &ctx)) {
		int e = cv_errno();
		return e == EWOULDBLOCK ? EAGAIN : e;
	}
	l->ack_cq_events(cq, 1);
	return 0;
}

static int cv_destroy_cq(cv_lib *l, cv_cq *c) {
	int rc = 0;
	if (c->owned) {
		rc = l->destroy_cq(c->cq);
		if (rc)
			return rc;
		rc = l->destroy_comp_channel(c->ch);
	}
	free(c->raw);
	free(c->out);
	free(c);
	return rc;
}

// A work request as Go writes it into C memory.
typedef struct {
	uint64_t id, local, remote;
	uint32_t len, lkey, rkey, op;
} cv_wr;

typedef struct {
	struct ibv_qp *qp;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;
	cv_wr *in;
	int cap;
	int bad;   // index of the first WR not posted, after cv_post
	int state; // after cv_qp_query
	int owned;
} cv_qp;

static cv_qp *cv_alloc_qp(int cap) {
	cv_qp *q = calloc(1, sizeof *q);
	if (!q)
		return NULL;
	q->cap = cap;
	q->wr = calloc(cap, sizeof *q->wr);
	q->sge = calloc(cap, sizeof *q->sge);
	q->in = calloc(cap, sizeof *q->in);
	if (!q->wr || !q->sge || !q->in) {
		free(q->wr);
		free(q->sge);
		free(q->in);
		free(q);
		return NULL;
	}
	return q;
}

static void cv_free_qp(cv_qp *q) {
	free(q->wr);
	free(q->sge);
	free(q->in);
	free(q);
}

static cv_qp *cv_create_qp(cv_lib *l, struct ibv_pd *pd, struct ibv_cq *cq, int max_send, int max_recv,
			   int max_send_sge, int max_recv_sge, int max_inline, int *err) {
	cv_qp *q = cv_alloc_qp(max_send);
	if (!q) {
		*err = ENOMEM;
		return NULL;
	}
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_recv_sge = max_recv_sge;
	a.cap.max_inline_data = max_inline;
	errno = 0;
	q->qp = l->create_qp(pd, &a);
	if (!q->qp) {
		*err = cv_errno();
		cv_free_qp(q);
		return NULL;
	}
	q->owned = 1;
	return q;
}

static uint32_t cv_qp_num(cv_qp *q) { return q->qp->qp_num; }

// cv_post chains the first n entries of q->in into signaled one-SGE
// RDMA work requests and posts them with one ibv_post_send. It returns 0
// or the errno of the post; q->bad is the index of the first WR not
// posted (n when all were).
static int cv_post(cv_qp *q, int n) {
	if (n > q->cap)
		n = q->cap;
	for (int i = 0; i < n; i++) {
		cv_wr *in = &q->in[i];
		struct ibv_sge *s = &q->sge[i];
		struct ibv_send_wr *w = &q->wr[i];
		s->addr = in->local;
		s->length = in->len;
		s->lkey = in->lkey;
		memset(w, 0, sizeof *w);
		w->wr_id = in->id;
		w->next = i + 1 < n ? &q->wr[i + 1] : NULL;
		w->sg_list = s;
		w->num_sge = 1;
		w->opcode = (enum ibv_wr_opcode)in->op;
		w->send_flags = IBV_SEND_SIGNALED;
		w->wr.rdma.remote_addr = in->remote;
		w->wr.rdma.rkey = in->rkey;
	}
	if (n == 0) {
		q->bad = 0;
		return 0;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(q->qp, q->wr, &bad);
	if (rc == 0)
		q->bad = n;
	else
		q->bad = bad ? (int)(bad - q->wr) : 0;
	return rc;
}

static int cv_qp_init(cv_lib *l, cv_qp *q, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.pkey_index = 0;
	a.qp_access_flags = access;
	return l->modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int cv_qp_rtr(cv_lib *l, cv_qp *q, uint8_t port, int mtu, uint32_t dqpn, uint16_t dlid, uint64_t gid_hi,
		     uint64_t gid_lo, int sgid_index, int global, uint8_t hop_limit, uint32_t rq_psn,
		     uint8_t max_dest_rd_atomic, uint8_t min_rnr_timer) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = (enum ibv_mtu)mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = max_dest_rd_atomic;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.static_rate = 0;
	a.ah_attr.port_num = port;
	a.ah_attr.is_global = global ? 1 : 0;
	if (global) {
		for (int i = 0; i < 8; i++) {
			a.ah_attr.grh.dgid.raw[i] = (uint8_t)(gid_hi >> (56 - 8 * i));
			a.ah_attr.grh.dgid.raw[8 + i] = (uint8_t)(gid_lo >> (56 - 8 * i));
		}
		a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
		a.ah_attr.grh.hop_limit = hop_limit;
	}
	return l->modify_qp(q->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int cv_qp_rts(cv_lib *l, cv_qp *q, uint8_t timeout, uint8_t retry, uint8_t rnr_retry, uint32_t sq_psn,
		     uint8_t max_rd_atomic) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr_retry;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = max_rd_atomic;
	return l->modify_qp(q->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC);
}

static int cv_qp_set_state(cv_lib *l, cv_qp *q, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = (enum ibv_qp_state)state;
	return l->modify_qp(q->qp, &a, IBV_QP_STATE);
}

static int cv_qp_query(cv_lib *l, cv_qp *q) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof a);
	int rc = l->query_qp(q->qp, &a, IBV_QP_STATE, &ia);
	if (rc == 0)
		q->state = a.qp_state;
	return rc;
}

static int cv_destroy_qp(cv_lib *l, cv_qp *q) {
	if (q->owned) {
		int rc = l->destroy_qp(q->qp);
		if (rc)
			return rc;
	}
	cv_free_qp(q);
	return 0;
}

#endif
