// A fake provider for tests: an ibv_context whose ops table records
// posted work requests and serves queued completions, and a completion
// channel backed by an eventfd. It lets the data-path shims (cv_post,
// cv_poll, cv_arm, cv_get_event) run without an RDMA NIC.
#ifndef CRESCENT_VERBS_FAKE_H
#define CRESCENT_VERBS_FAKE_H

#include <sys/eventfd.h>
#include <unistd.h>
#include "shim.h"

#define FAKE_MAX 1024

typedef struct {
	struct ibv_context ctx; // first: the ops' objects point back to it
	struct ibv_cq cq;
	struct ibv_qp qp;
	struct ibv_comp_channel ch;
	int posts, polls, arms, nrec, fail_at, fail_errno;
	cv_wr rec[FAKE_MAX];
	int rec_flags[FAKE_MAX], rec_nsge[FAKE_MAX];
	struct ibv_wc q[FAKE_MAX];
	int qlen, qhead;
} cv_fake;

static cv_fake *fake_of(struct ibv_context *c) { return (cv_fake *)c; }

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	cv_fake *f = fake_of(qp->context);
	f->posts++;
	for (int i = 0; wr; wr = wr->next, i++) {
		if (i == f->fail_at) {
			*bad = wr;
			return f->fail_errno;
		}
		if (f->nrec < FAKE_MAX) {
			cv_wr *r = &f->rec[f->nrec];
			r->id = wr->wr_id;
			r->local = wr->sg_list[0].addr;
			r->len = wr->sg_list[0].length;
			r->lkey = wr->sg_list[0].lkey;
			r->remote = wr->wr.rdma.remote_addr;
			r->rkey = wr->wr.rdma.rkey;
			r->op = wr->opcode;
			f->rec_flags[f->nrec] = wr->send_flags;
			f->rec_nsge[f->nrec] = wr->num_sge;
			f->nrec++;
		}
	}
	return 0;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	cv_fake *f = fake_of(cq->context);
	f->polls++;
	int k = 0;
	while (k < n && f->qhead < f->qlen)
		wc[k++] = f->q[f->qhead++];
	return k;
}

static int fake_req_notify(struct ibv_cq *cq, int solicited) {
	(void)solicited;
	fake_of(cq->context)->arms++;
	return 0;
}

static int fake_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx) {
	uint64_t v;
	if (read(ch->fd, &v, sizeof v) != sizeof v)
		return -1;
	*cq = &fake_of(ch->context)->cq;
	*ctx = NULL;
	return 0;
}

static void fake_ack(struct ibv_cq *cq, unsigned int n) {
	(void)cq;
	(void)n;
}

static cv_fake *fake_new(void) {
	cv_fake *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	f->fail_at = -1;
	f->ctx.ops.post_send = fake_post_send;
	f->ctx.ops.poll_cq = fake_poll_cq;
	f->ctx.ops.req_notify_cq = fake_req_notify;
	f->cq.context = &f->ctx;
	f->qp.context = &f->ctx;
	f->qp.qp_num = 0x1234;
	f->ch.context = &f->ctx;
	f->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	return f;
}

static void fake_free(cv_fake *f) {
	close(f->ch.fd);
	free(f);
}

static cv_lib *fake_lib(void) {
	cv_lib *l = calloc(1, sizeof *l);
	if (l) {
		l->get_cq_event = fake_get_cq_event;
		l->ack_cq_events = fake_ack;
	}
	return l;
}

static cv_cq *fake_cq(cv_fake *f, int cap) {
	cv_cq *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->ch = &f->ch;
	c->cq = &f->cq;
	c->cap = cap;
	c->raw = calloc(cap, sizeof *c->raw);
	c->out = calloc(cap, sizeof *c->out);
	return c;
}

static cv_qp *fake_qp(cv_fake *f, int cap) {
	cv_qp *q = cv_alloc_qp(cap);
	if (q)
		q->qp = &f->qp;
	return q;
}

static void fake_push(cv_fake *f, uint64_t id, int status, int opcode, uint32_t len, uint32_t qpn, uint32_t vendor) {
	if (f->qlen == FAKE_MAX)
		return;
	struct ibv_wc *w = &f->q[f->qlen++];
	memset(w, 0, sizeof *w);
	w->wr_id = id;
	w->status = (enum ibv_wc_status)status;
	w->opcode = (enum ibv_wc_opcode)opcode;
	w->byte_len = len;
	w->qp_num = qpn;
	w->vendor_err = vendor;
}

static void fake_signal(cv_fake *f) {
	uint64_t one = 1;
	if (write(f->ch.fd, &one, sizeof one) != sizeof one)
		abort();
}

#endif
