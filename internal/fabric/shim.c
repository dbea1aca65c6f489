//go:build cgo && fabric

/*
 * Crescent's libfabric shim; see shim.h. It lives in the package folder
 * (not csrc/) so that the go command tracks it: files included from
 * outside a package do not invalidate the build cache.
 */
#include "shim.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>

/* Posting stops after this many -FI_EAGAIN returns in one call (progress is
 * made between tries); the caller tries again later. */
#define CF_EAGAIN_RETRIES 8
#define CF_READ_CHUNK 64

static struct {
	void *handle;
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
	uint32_t (*version)(void);
} lib;

/* Forwarders for the renamed entry points (see fabric.h). */
int cf_fi_getinfo(uint32_t v, const char *node, const char *service, uint64_t flags, const struct fi_info *hints, struct fi_info **info)
{
	return lib.getinfo(v, node, service, flags, hints, info);
}
void cf_fi_freeinfo(struct fi_info *info) { lib.freeinfo(info); }
struct fi_info *cf_fi_dupinfo(const struct fi_info *info) { return lib.dupinfo(info); }
int cf_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
	return lib.fabric(attr, fabric, context);
}
const char *cf_fi_strerror(int errnum) { return lib.strerror ? lib.strerror(errnum) : "libfabric not loaded"; }
uint32_t cf_fi_version(void) { return lib.version ? lib.version() : 0; }

static void seterr(char *err, size_t errlen, const char *what, int rc)
{
	if (err && errlen)
		snprintf(err, errlen, "%s: %s (%d)", what, fi_strerror(rc < 0 ? -rc : rc), rc);
}

static int cf_load_unguarded(const char *path, char *err, size_t errlen)
{
	if (lib.handle)
		return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	void *f[6];
	const char *names[6] = {"fi_getinfo", "fi_freeinfo", "fi_dupinfo", "fi_fabric", "fi_strerror", "fi_version"};
	for (int i = 0; i < 6; i++) {
		f[i] = dlsym(h, names[i]);
		if (!f[i]) {
			snprintf(err, errlen, "%s: missing symbol %s", path, names[i]);
			dlclose(h);
			return -1;
		}
	}
	uint32_t (*version)(void) = (uint32_t(*)(void))f[5];
	uint32_t v = version();
	if (FI_VERSION_LT(v, FI_VERSION(1, 5))) {
		snprintf(err, errlen, "%s is libfabric %u.%u; 1.5 or newer is needed", path, FI_MAJOR(v), FI_MINOR(v));
		dlclose(h);
		return -1;
	}
	lib.getinfo = (int (*)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **))f[0];
	lib.freeinfo = (void (*)(struct fi_info *))f[1];
	lib.dupinfo = (struct fi_info * (*)(const struct fi_info *)) f[2];
	lib.fabric = (int (*)(struct fi_fabric_attr *, struct fid_fabric **, void *))f[3];
	lib.strerror = (const char *(*)(int))f[4];
	lib.version = version;
	lib.handle = h; /* kept for the life of the process */
	return 0;
}

/* cf_probe reports whether path can be opened, without keeping it. */
static int cf_probe_unguarded(const char *path, char *err, size_t errlen)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	dlclose(h);
	return 0;
}

uint32_t cf_lib_version(void) { return cf_fi_version(); }

/* The API version requested: the library's, capped at the headers' (the
 * structures used are those of the headers). */
uint32_t cf_api_version(void)
{
	uint32_t v = cf_fi_version();
	uint32_t h = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
	return FI_VERSION_LT(v, h) ? v : h;
}

const char *cf_strerror(int code) { return fi_strerror(code < 0 ? -code : code); }

static struct fi_info *hints_for(const char *prov, uint64_t tx_size, int delivery)
{
	struct fi_info *h = fi_allocinfo();
	if (!h)
		return NULL;
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	/* Every mode bit this shim honours; the provider keeps those it needs. */
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	h->domain_attr->threading = FI_THREAD_DOMAIN; /* callers serialise per domain */
	if (tx_size)
		h->tx_attr->size = tx_size;
	if (delivery)
		h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	if (prov && *prov)
		h->fabric_attr->prov_name = strdup(prov);
	return h;
}

static int is_loopback(const struct fi_info *i)
{
	if (!i->src_addr)
		return 0;
	const struct sockaddr *sa = (const struct sockaddr *)i->src_addr;
	switch (i->addr_format) {
	case FI_SOCKADDR:
	case FI_SOCKADDR_IN:
	case FI_SOCKADDR_IN6:
		break;
	default:
		return 0;
	}
	if (sa->sa_family == AF_INET && i->src_addrlen >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		return (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6 && i->src_addrlen >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		return memcmp(&s6->sin6_addr, &in6addr_loopback, sizeof(struct in6_addr)) == 0;
	}
	return 0;
}

static void copystr(char *dst, size_t n, const char *src)
{
	snprintf(dst, n, "%s", src ? src : "");
}

static int cf_discover_unguarded(const char *prov, uint64_t tx_size, int delivery, cf_dominfo *out, int max, int *n, char *err, size_t errlen)
{
	*n = 0;
	struct fi_info *h = hints_for(prov, tx_size, delivery), *list = NULL;
	if (!h) {
		seterr(err, errlen, "fi_allocinfo", -FI_ENOMEM);
		return -FI_ENOMEM;
	}
	int rc = fi_getinfo(cf_api_version(), NULL, NULL, 0, h, &list);
	fi_freeinfo(h);
	if (rc) {
		seterr(err, errlen, "fi_getinfo", rc);
		return rc;
	}
	for (struct fi_info *i = list; i && *n < max; i = i->next) {
		int dup = 0;
		for (int k = 0; k < *n; k++)
			if (!strcmp(out[k].prov, i->fabric_attr->prov_name) && !strcmp(out[k].domain, i->domain_attr->name))
				dup = 1;
		if (dup)
			continue;
		cf_dominfo *d = &out[(*n)++];
		memset(d, 0, sizeof *d);
		copystr(d->prov, sizeof d->prov, i->fabric_attr->prov_name);
		copystr(d->fabric, sizeof d->fabric, i->fabric_attr->name);
		copystr(d->domain, sizeof d->domain, i->domain_attr->name);
		d->mr_mode = (uint64_t)i->domain_attr->mr_mode;
		d->caps = i->caps;
		d->max_msg = i->ep_attr->max_msg_size;
		d->tx_size = i->tx_attr->size;
		d->rx_size = i->rx_attr->size;
		d->progress = i->domain_attr->data_progress;
		d->loopback = is_loopback(i);
		d->addr_format = (int32_t)i->addr_format;
		if (i->src_addr && i->src_addrlen <= CF_ADDRMAX) {
			memcpy(d->src, i->src_addr, i->src_addrlen);
			d->src_len = (int32_t)i->src_addrlen;
		}
	}
	fi_freeinfo(list);
	return 0;
}

static int cf_ep_open_unguarded(cf_ep *e, char *err, size_t errlen)
{
	int rc = fi_endpoint(e->domain, e->info, &e->ep, NULL);
	if (rc) {
		e->ep = NULL;
		seterr(err, errlen, "fi_endpoint", rc);
		return rc;
	}
	if ((rc = fi_ep_bind(e->ep, &e->av->fid, 0))) {
		seterr(err, errlen, "fi_ep_bind(av)", rc);
		goto fail;
	}
	if ((rc = fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV))) {
		seterr(err, errlen, "fi_ep_bind(cq)", rc);
		goto fail;
	}
	if ((rc = fi_enable(e->ep))) {
		seterr(err, errlen, "fi_enable", rc);
		goto fail;
	}
	e->namelen = sizeof e->name;
	if ((rc = fi_getname(&e->ep->fid, e->name, &e->namelen))) {
		seterr(err, errlen, "fi_getname", rc);
		goto fail;
	}
	return 0;
fail:
	fi_close(&e->ep->fid);
	e->ep = NULL;
	return rc;
}

int cf_ep_close(cf_ep *e)
{
	int rc = 0;
	if (e->ep)
		rc = fi_close(&e->ep->fid);
	e->ep = NULL;
	return rc;
}

static int cf_open_unguarded(const char *prov, const char *domain, const cf_opts *o, cf_ep **out, char *err, size_t errlen)
{
	*out = NULL;
	struct fi_info *h = hints_for(prov, o->tx_size, o->delivery), *list = NULL;
	if (!h) {
		seterr(err, errlen, "fi_allocinfo", -FI_ENOMEM);
		return -FI_ENOMEM;
	}
	int rc = fi_getinfo(cf_api_version(), NULL, NULL, 0, h, &list);
	fi_freeinfo(h);
	if (rc) {
		seterr(err, errlen, "fi_getinfo", rc);
		return rc;
	}
	struct fi_info *pick = NULL;
	for (struct fi_info *i = list; i; i = i->next)
		if (!strcmp(i->fabric_attr->prov_name, prov) && !strcmp(i->domain_attr->name, domain)) {
			pick = i;
			break;
		}
	if (!pick) {
		fi_freeinfo(list);
		snprintf(err, errlen, "provider %s offers no domain %s", prov, domain);
		return -FI_ENODATA;
	}
	cf_ep *e = calloc(1, sizeof *e);
	if (!e) {
		fi_freeinfo(list);
		seterr(err, errlen, "calloc", -FI_ENOMEM);
		return -FI_ENOMEM;
	}
	e->wait_fd = -1;
	e->info = fi_dupinfo(pick);
	fi_freeinfo(list);
	if (!e->info) {
		free(e);
		seterr(err, errlen, "fi_dupinfo", -FI_ENOMEM);
		return -FI_ENOMEM;
	}
	e->nslots = o->nslots;
	e->maxops = o->maxops;
	e->maxcomps = o->maxcomps;
	e->slots = calloc(o->nslots, sizeof(cf_slot));
	e->ops = calloc(o->maxops, sizeof(cf_op));
	e->comps = calloc(o->maxcomps, sizeof(cf_comp));
	if (!e->slots || !e->ops || !e->comps) {
		seterr(err, errlen, "calloc", -FI_ENOMEM);
		rc = -FI_ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < o->nslots; i++)
		e->slots[i].id = i;
	e->write_flags = FI_COMPLETION | (o->delivery ? FI_DELIVERY_COMPLETE : 0);

	if ((rc = fi_fabric(e->info->fabric_attr, &e->fabric, NULL))) {
		e->fabric = NULL;
		seterr(err, errlen, "fi_fabric", rc);
		goto fail;
	}
	if ((rc = fi_domain(e->fabric, e->info, &e->domain, NULL))) {
		e->domain = NULL;
		seterr(err, errlen, "fi_domain", rc);
		goto fail;
	}
	struct fi_av_attr ava = {0};
	ava.type = FI_AV_TABLE;
	ava.count = o->av_count;
	rc = fi_av_open(e->domain, &ava, &e->av, NULL);
	if (rc && ava.count) {
		ava.count = 0; /* the provider's own size (shm caps it) */
		rc = fi_av_open(e->domain, &ava, &e->av, NULL);
	}
	if (rc) {
		e->av = NULL;
		seterr(err, errlen, "fi_av_open", rc);
		goto fail;
	}
	struct fi_cq_attr cqa = {0};
	cqa.size = o->cq_size;
	cqa.format = FI_CQ_FORMAT_CONTEXT;
	cqa.wait_obj = o->wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
	rc = fi_cq_open(e->domain, &cqa, &e->cq, NULL);
	if (rc && o->wait_fd) {
		cqa.wait_obj = FI_WAIT_NONE; /* the provider has no fd to offer */
		rc = fi_cq_open(e->domain, &cqa, &e->cq, NULL);
	}
	if (rc) {
		e->cq = NULL;
		seterr(err, errlen, "fi_cq_open", rc);
		goto fail;
	}
	if (cqa.wait_obj == FI_WAIT_FD) {
		int fd = -1;
		if (fi_control(&e->cq->fid, FI_GETWAIT, &fd) == 0)
			e->wait_fd = fd;
	}
	if ((rc = cf_ep_open(e, err, errlen)))
		goto fail;
	*out = e;
	return 0;
fail:
	cf_close(e);
	return rc;
}

void cf_close(cf_ep *e)
{
	if (!e)
		return;
	cf_ep_close(e);
	if (e->cq)
		fi_close(&e->cq->fid);
	if (e->av)
		fi_close(&e->av->fid);
	if (e->domain)
		fi_close(&e->domain->fid);
	if (e->fabric)
		fi_close(&e->fabric->fid);
	if (e->info)
		fi_freeinfo(e->info);
	free(e->slots);
	free(e->ops);
	free(e->comps);
	free(e);
}

int cf_mr_reg(cf_ep *e, uint64_t addr, uint64_t len, uint64_t key, struct fid_mr **mr, uint64_t *outkey, void **desc)
{
	uint64_t mode = e->info->domain_attr->mr_mode;
	if (mode & FI_MR_PROV_KEY)
		key = 0;
	int rc = fi_mr_reg(e->domain, (void *)(uintptr_t)addr, len, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, key, 0, mr, NULL);
	if (rc) {
		*mr = NULL;
		return rc;
	}
	if (mode & FI_MR_ENDPOINT) {
		if ((rc = fi_mr_bind(*mr, &e->ep->fid, 0)) || (rc = fi_mr_enable(*mr))) {
			fi_close(&(*mr)->fid);
			*mr = NULL;
			return rc;
		}
	}
	*outkey = fi_mr_key(*mr);
	if (*outkey == FI_KEY_NOTAVAIL) {
		fi_close(&(*mr)->fid);
		*mr = NULL;
		return -FI_ENOKEY; /* raw keys longer than 64 bits: unsupported */
	}
	*desc = fi_mr_desc(*mr);
	return 0;
}

int cf_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

int cf_av_insert(cf_ep *e, const void *addr, size_t len, uint64_t *out)
{
	(void)len; /* the address format fixes the length */
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int rc = fi_av_insert(e->av, addr, 1, &a, 0, NULL);
	if (rc == 1 && a != FI_ADDR_NOTAVAIL) {
		*out = a;
		return 0;
	}
	return rc < 0 ? rc : -FI_EINVAL;
}

int cf_av_remove(cf_ep *e, uint64_t addr)
{
	fi_addr_t a = addr;
	return fi_av_remove(e->av, &a, 1, 0);
}

int cf_cancel(cf_ep *e, uint32_t slot)
{
	if (!e->ep || slot >= e->nslots)
		return -FI_EINVAL;
	return (int)fi_cancel(&e->ep->fid, &e->slots[slot].ctx);
}

static ssize_t post_one(cf_ep *e, const cf_op *op, uint64_t more)
{
	if (op->slot >= e->nslots || !e->ep)
		return -FI_EINVAL;
	struct iovec iov = {(void *)(uintptr_t)op->local, op->len};
	void *desc = op->desc;
	struct fi_rma_iov riov = {op->remote, op->len, op->key};
	struct fi_msg_rma msg = {0};
	msg.msg_iov = &iov;
	msg.desc = &desc;
	msg.iov_count = 1;
	msg.addr = op->peer;
	msg.rma_iov = &riov;
	msg.rma_iov_count = 1;
	msg.context = &e->slots[op->slot].ctx;
	if (op->write)
		return fi_writemsg(e->ep, &msg, e->write_flags | more);
	return fi_readmsg(e->ep, &msg, FI_COMPLETION | more);
}

static uint32_t slot_of(cf_ep *e, void *ctx)
{
	if (!ctx)
		return UINT32_MAX;
	cf_slot *s = (cf_slot *)ctx;
	if (s < e->slots || s >= e->slots + e->nslots)
		return UINT32_MAX;
	return s->id;
}

/* read_cq appends completions to e->comps from *pos; it returns a
 * fi_cq_read error other than EAGAIN, else 0. */
static int read_cq(cf_ep *e, uint32_t *pos)
{
	struct fi_cq_entry buf[CF_READ_CHUNK];
	while (*pos < e->maxcomps) {
		size_t want = e->maxcomps - *pos;
		if (want > CF_READ_CHUNK)
			want = CF_READ_CHUNK;
		ssize_t n = fi_cq_read(e->cq, buf, want);
		if (n > 0) {
			for (ssize_t k = 0; k < n; k++) {
				cf_comp *c = &e->comps[(*pos)++];
				c->slot = slot_of(e, buf[k].op_context);
				c->err = 0;
				c->prov_errno = 0;
				c->msg[0] = 0;
			}
			if ((size_t)n < want)
				return 0;
			continue;
		}
		if (n == -FI_EAGAIN)
			return 0;
		if (n != -FI_EAVAIL)
			return (int)n;
		struct fi_cq_err_entry ee;
		memset(&ee, 0, sizeof ee);
		if (fi_cq_readerr(e->cq, &ee, 0) != 1)
			return 0;
		cf_comp *c = &e->comps[(*pos)++];
		c->slot = slot_of(e, ee.op_context);
		c->err = ee.err ? ee.err : FI_EOTHER;
		c->prov_errno = ee.prov_errno;
		char tmp[CF_MSGLEN];
		const char *m = fi_cq_strerror(e->cq, ee.prov_errno, ee.err_data, tmp, sizeof tmp);
		copystr(c->msg, sizeof c->msg, m ? m : "");
	}
	return 0;
}

void cf_progress(cf_ep *e, int nops, int want_wait, cf_result *r)
{
	memset(r, 0, sizeof *r);
	uint32_t pos = 0;
	int i;
	if (!e->ep)
		nops = 0;
	for (i = 0; i < nops; i++) {
		cf_op *op = &e->ops[i];
		uint64_t more = i + 1 < nops ? FI_MORE : 0;
		int tries = 0;
		ssize_t rc;
		while ((rc = post_one(e, op, more)) == -FI_EAGAIN) {
			r->eagain++;
			e->eagain++;
			if (++tries > CF_EAGAIN_RETRIES || pos >= e->maxcomps)
				break;
			/* The queue is full: make progress (and collect what
			 * completed) before trying again. */
			int err = read_cq(e, &pos);
			if (err)
				r->err = err;
		}
		op->rc = (int32_t)rc;
		if (rc == -FI_EAGAIN)
			break;
		if (rc == 0)
			r->posted++;
	}
	r->attempted = i;
	int err = read_cq(e, &pos);
	if (err)
		r->err = err;
	r->ncomp = (int32_t)pos;
	if (want_wait && e->wait_fd >= 0 && r->posted == 0 && pos == 0 && r->eagain == 0) {
		struct fid *f = &e->cq->fid;
		r->may_wait = fi_trywait(e->fabric, &f, 1) == 0;
	}
}

/*
 * Some libfabric providers install their own SIGINT/SIGTERM (and other)
 * handlers when they load or open a domain, which would take signals away
 * from the Go runtime (a SIGTERM then exits the process at once instead of
 * reaching os/signal). Every entry point that may load or start a provider
 * puts back the handlers it found.
 */
static const int cf_guarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE,
				 SIGCHLD, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPROF, SIGURG, SIGWINCH};
#define CF_NGUARDED (int)(sizeof cf_guarded / sizeof cf_guarded[0])

static void sig_save(struct sigaction *saved)
{
	for (int i = 0; i < CF_NGUARDED; i++)
		sigaction(cf_guarded[i], NULL, &saved[i]);
}

static void sig_restore(const struct sigaction *saved)
{
	for (int i = 0; i < CF_NGUARDED; i++) {
		struct sigaction now;
		if (sigaction(cf_guarded[i], NULL, &now) == 0 &&
		    (now.sa_handler != saved[i].sa_handler || now.sa_flags != saved[i].sa_flags))
			sigaction(cf_guarded[i], &saved[i], NULL);
	}
}

int cf_load(const char *path, char *err, size_t errlen)
{
	struct sigaction saved[CF_NGUARDED];
	sig_save(saved);
	int rc = cf_load_unguarded(path, err, errlen);
	sig_restore(saved);
	return rc;
}

int cf_discover(const char *prov, uint64_t tx_size, int delivery, cf_dominfo *out, int max, int *n, char *err, size_t errlen)
{
	struct sigaction saved[CF_NGUARDED];
	sig_save(saved);
	int rc = cf_discover_unguarded(prov, tx_size, delivery, out, max, n, err, errlen);
	sig_restore(saved);
	return rc;
}

int cf_ep_open(cf_ep *e, char *err, size_t errlen)
{
	struct sigaction saved[CF_NGUARDED];
	sig_save(saved);
	int rc = cf_ep_open_unguarded(e, err, errlen);
	sig_restore(saved);
	return rc;
}

int cf_open(const char *prov, const char *domain, const cf_opts *o, cf_ep **out, char *err, size_t errlen)
{
	struct sigaction saved[CF_NGUARDED];
	sig_save(saved);
	int rc = cf_open_unguarded(prov, domain, o, out, err, errlen);
	sig_restore(saved);
	return rc;
}

int cf_probe(const char *path, char *err, size_t errlen)
{
	struct sigaction saved[CF_NGUARDED];
	sig_save(saved);
	int rc = cf_probe_unguarded(path, err, errlen);
	sig_restore(saved);
	return rc;
}
