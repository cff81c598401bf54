"""`biprm serve`: a BiPRM behind HTTP, on FastAPI + uvicorn.

Endpoints:
- POST /v1/score: one solution or a list of them, each a question plus `steps` or a
  free-text `solution` cut by a segmenter (the item's, else the server's); per-step l2r, r2l, sigma and fused
  scores and the solution score under every aggregation come back, and for a cut solution each step's [start, end).
- POST /get_reward: the remote reward-model interface of OpenRLHF (and of trainers that
  copy it): {"query": [prompt + response, ...], "prompts": [prompt, ...]} in,
  {"rewards", "scores": [one float per query], "extra_logs": {...}, "step_rewards": [[...]]} out;
  aggregation, segmenter and the policy's chat template are server flags.
- GET /health, GET /metrics (Prometheus text: queue depth, batch sizes, latencies).

With --api-key (or BIPRM_API_KEY) every endpoint but /health wants `Authorization: Bearer KEY`.
A vLLM engine that has died makes /health and every request a 503 naming the cause.

Requests are bounded before any work: bodies by --max-body-bytes, each solution's text by
--max-text-chars. Tokenizing runs on a thread pool, so one large request never holds up
the event loop that accepts, refuses and answers the others.

Every scoring request goes through one `Batcher`, so concurrent clients share model calls.
The scorer underneath is biprm's own `Scorer` or, with --engine vllm, a vLLM engine
running biprm's plugin (`biprm.vllm_plugin`), or two for an implicit PRM (`biprm.serve.vllm_engine`);
the endpoints are the same.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from biprm.config import MODE_TABLE, check_segmenter
from biprm.data.encoding import Encoded
from biprm.data.segment import Cut, Segmenter
from biprm.data.trajectory import DataError, Trajectory
from biprm.metrics.first_error import predict_first_error
from biprm.scoring.step_scores import STEP_OUTPUTS, StepScores, score_rows
from biprm.scoring.score_file import trace_segmenter
from biprm.scoring.scorer import Scorer
from biprm.serve.batcher import Batcher, Overloaded
from biprm.serve.chat import ChatPrompt
from biprm.serve.config import API_KEY_ENV, ServeConfig
from biprm.serve.vllm_engine import VLLMScorer

log = logging.getLogger(__name__)
TOKENIZE_THREADS = 4  # requests tokenized at once, beside the event loop


class ScoreItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    steps: list[str] | None = Field(default=None, min_length=1, description="the solution's steps, in order")
    solution: str | None = Field(default=None, description="free text, cut into steps by `segmenter`")
    segmenter: str | None = Field(
        default=None,
        validation_alias=AliasChoices("segmenter", "split"),
        description="paragraph, lines, markers, tokens:N or a split rule; the server's if unset "
        "('split': its old name)",
    )

    @field_validator("segmenter")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is not None:
            check_segmenter(name)
        return name

    @model_validator(mode="after")
    def _one_of(self) -> "ScoreItem":
        if (self.steps is None) == (self.solution is None):
            raise ValueError("give exactly one of 'steps' and 'solution'")
        return self


class RewardRequest(BaseModel):
    query: list[str] = Field(min_length=1, description="prompt + response, as the policy produced them")
    prompts: list[str] = Field(min_length=1, description="the prompt part of each query")


class ServiceError(Exception):
    """An answer with `status` and {"error": message}; a 503 says when to retry unless retrying here is pointless."""

    def __init__(self, status: int, message: str, retry: bool = True):
        super().__init__(message)
        self.status, self.retry = status, retry


def _cut(text: str, segmenter: Segmenter, where: str) -> Cut:
    """The steps of a free-text solution with their spans; an empty one, or one cut into no steps, is a 400 naming
    `where`."""
    try:
        return segmenter.cut(text, where)
    except DataError as error:
        raise ServiceError(400, str(error)) from None


class Service:
    """The model side of the server: requests -> trajectories -> batched scores -> JSON."""

    def __init__(self, scorer: Scorer | VLLMScorer, cfg: ServeConfig):
        if scorer.max_length != cfg.max_length:
            raise ValueError(
                f"the scorer reads {scorer.max_length} tokens per stream, the settings say --max-length "
                f"{cfg.max_length}"
            )
        self.scorer, self.cfg = scorer, cfg
        self.batcher = Batcher(self._score, cfg.max_wait_ms, cfg.max_batch_tokens, cfg.max_queue)
        self.tokenize_pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="biprm-tokenize")
        self.chat = ChatPrompt.load(cfg.chat_template) if cfg.chat_template else None
        tok = scorer.tokenizer
        self.segmenter = trace_segmenter([cfg.model], cfg.segmenter, tok)
        self.special = sorted(
            {t for t in (tok.eos_token, tok.pad_token, *(self.chat.special if self.chat else ())) if t},
            key=len,
            reverse=True,
        )

    def check_text(self, chars: int, where: str) -> None:
        """Refuse text too long to be worth tokenizing, before any work is spent on it."""
        if chars > self.cfg.max_text_chars:
            raise ServiceError(
                413,
                f"{where}: {chars} characters; this server takes at most {self.cfg.max_text_chars} per solution "
                "(--max-text-chars)",
            )

    def _score(self, encs: list[Encoded]) -> StepScores:
        return self.scorer.score(encs, progress=False)

    def failure(self) -> str | None:
        """Why the scorer can no longer score (its vLLM engine has died); None while it can."""
        return self.scorer.failure() if isinstance(self.scorer, VLLMScorer) else None

    def check_alive(self) -> None:
        if why := self.failure():
            raise ServiceError(503, f"this server cannot score until it is restarted: {why}", retry=False)

    async def run(self, trajs: list[Trajectory], names: list[str]) -> tuple[StepScores, list[Encoded]]:
        """(scores, the encodings: what each trajectory's length cost); bad text is a 400 naming the item, over-long
        a flag or 413."""
        if len(trajs) > self.cfg.max_queue:
            raise ServiceError(
                413,
                f"{len(trajs)} solutions in one request; this server takes at most {self.cfg.max_queue} solutions per "
                "request (--max-queue)",
            )
        encs = await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, self._encode, trajs, names)
        dropped = np.array([e.n_dropped for e in encs])
        if self.cfg.on_overlength == "refuse" and dropped.any():
            i = int(np.flatnonzero(dropped)[0])
            raise ServiceError(
                413,
                f"{names[i]}: longer than max_length={self.cfg.max_length} tokens ({dropped[i]} trailing steps would "
                "not be scored)",
            )
        self.check_alive()
        try:
            scores = await self.batcher.submit(
                encs, sum(e.n_tokens for e in encs) * len(MODE_TABLE[self.scorer.mode].streams)
            )
        except Overloaded as error:
            raise ServiceError(503, str(error)) from None
        except Exception:
            self.check_alive()  # the engine died under this request: a 503 naming why; any other failure stays a 500
            raise
        return scores, encs

    def _encode(self, trajs: list[Trajectory], names: list[str]) -> list[Encoded]:
        try:
            return self.scorer.encode(trajs, names)[0]
        except DataError as error:
            raise ServiceError(413 if "max_length" in str(error) else 400, str(error)) from None

    async def score(self, items: list[ScoreItem]) -> list[dict]:
        trajs, cuts = [], []
        for i, it in enumerate(items):
            self.check_text(
                len(it.question) + (len(it.solution) if it.steps is None else sum(map(len, it.steps))), f"item {i}"
            )
            segmenter = self.segmenter if it.segmenter is None else Segmenter(it.segmenter, self.scorer.tokenizer)
            cuts.append(None if it.steps is not None else _cut(it.solution, segmenter, f"item {i}: field 'solution'"))
            trajs.append(Trajectory(it.question, it.steps if cuts[-1] is None else cuts[-1].texts))
        scores, encs = await self.run(trajs, [f"item {i}" for i in range(len(items))])
        keys = (
            "steps",
            *STEP_OUTPUTS,
            "solution",
            "solution_logit",
            "steps_scored",
            "n_dropped",
            "first_scored",
            "windowed",
        )  # what `biprm score` writes, less the input's own fields
        return [
            {**{k: row[k] for k in keys}, "truncated": row["n_dropped"] > 0, **(cut.meta() if cut else {})}
            for row, cut in zip(score_rows(trajs, scores, digits=None, encs=encs), cuts)
        ]

    def question(self, prompt: str, i: int) -> str:
        """The plain question: the prompt itself, or its last user message under --chat-template."""
        if self.chat is None:
            if not prompt.strip():
                raise ServiceError(400, f"field 'prompts' [{i}] is empty")
            return prompt.strip()
        question = self.chat.question(prompt)
        if not question:
            raise ServiceError(
                400, f"field 'prompts' [{i}] is not a prompt of the chat template of {self.chat.name} (--chat-template)"
            )
        return question

    async def reward(self, req: RewardRequest) -> dict:
        """OpenRLHF's answer: `rewards` and `scores` (the solution score), `extra_logs` (one value per query,
        as trainers log them) and the per-step fused probabilities in `step_rewards`."""
        if len(req.query) != len(req.prompts):
            raise ServiceError(
                400, f"field 'prompts' has {len(req.prompts)} entries for {len(req.query)} in field 'query'"
            )
        trajs = []
        for i, (query, prompt) in enumerate(zip(req.query, req.prompts)):
            self.check_text(len(query), f"field 'query' [{i}]")
            if not query.startswith(prompt):
                raise ServiceError(400, f"field 'query' [{i}] does not start with field 'prompts' [{i}]")
            response = query[len(prompt) :]
            for (
                token
            ) in self.special:  # the policy's turn markup, padding and end-of-sequence text are not part of the answer
                response = response.replace(token, "")
            trajs.append(
                Trajectory(self.question(prompt, i), _cut(response, self.segmenter, f"field 'query' [{i}]").texts)
            )
        scores, _ = await self.run(trajs, [f"field 'query' [{i}]" for i in range(len(trajs))])
        rewards = scores.solution_scores(self.cfg.aggregation).tolist()
        probs = scores.prob()
        return {
            "rewards": rewards,
            "scores": rewards,
            "extra_logs": {
                "first_step_below_threshold": predict_first_error(probs, scores.offsets, self.cfg.threshold).tolist(),
                "steps_scored": np.diff(scores.offsets).tolist(),
            },
            "step_rewards": [probs[a:b].tolist() for a, b in zip(scores.offsets[:-1], scores.offsets[1:])],
        }

    def metrics(self) -> str:
        s, b = self.batcher.stats, self.batcher
        lines = [
            "# TYPE biprm_requests_total counter",
            f"biprm_requests_total {s.requests}",
            "# TYPE biprm_rejected_total counter",
            f"biprm_rejected_total {s.rejected}",
            "# TYPE biprm_failed_total counter",
            f"biprm_failed_total {s.failed}",
            "# TYPE biprm_batches_total counter",
            f"biprm_batches_total {s.batches}",
            "# TYPE biprm_solutions_total counter",
            f"biprm_solutions_total {s.solutions}",
            "# TYPE biprm_queue_solutions gauge",
            f"biprm_queue_solutions {b.queued}",
        ]
        for name, values in (("biprm_batch_solutions", s.batch_sizes), ("biprm_latency_seconds", s.latencies)):
            lines.append(f"# TYPE {name} summary")
            if values:
                v = np.array(values, dtype=float)
                lines += [f'{name}{{quantile="{q}"}} {np.quantile(v, q):.6g}' for q in (0.5, 0.9, 0.99)]
            lines += [f"{name}_sum {float(np.sum(values)):.6g}", f"{name}_count {len(values)}"]
        return "\n".join(lines) + "\n"


def _describe(errors: list[dict]) -> str:
    """Pydantic errors as one line that names each field ("item 2: field 'steps': ...")."""
    parts = []
    for e in errors:
        loc = [x for x in e["loc"] if x != "body"]
        head = f"item {loc.pop(0)}: " if loc and isinstance(loc[0], int) else ""
        name = ".".join(str(x) for x in loc)
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's wording for a validator's ValueError
        parts.append(f"{head}field '{name}': {msg}" if name else f"{head}{msg}")
    return "; ".join(parts)


_ITEMS = TypeAdapter(list[ScoreItem])


async def _json(request: Request, limit: int):
    """The parsed body; one larger than `limit` bytes is refused as soon as that is known, unread."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ServiceError(413, f"the body has {declared} bytes; this server reads at most {limit} (--max-body-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ServiceError(
                413, f"the body has more than {limit} bytes; this server reads at most {limit} (--max-body-bytes)"
            )
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deep to parse
        raise ServiceError(400, "the body is not valid JSON") from None


def _bearer_matches(request: Request, key: str) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())  # in constant time


def _body_schema(schema: dict) -> dict:
    """The request body's schema for the OpenAPI page (the endpoints parse the body themselves, to word errors)."""
    return {"requestBody": {"content": {"application/json": {"schema": schema}}, "required": True}}


def build_app(scorer: Scorer | VLLMScorer, cfg: ServeConfig, owns_scorer: bool = False) -> FastAPI:
    """The server around `scorer`; with `owns_scorer` it also stops the scorer's vLLM engine when it shuts down
    (the engine runs in processes of its own, which would outlive the server)."""
    service = Service(scorer, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.batcher.start()
        yield
        await service.batcher.stop()
        service.tokenize_pool.shutdown(wait=True)
        if owns_scorer and isinstance(scorer, VLLMScorer):
            scorer.close()

    app = FastAPI(title="biprm", summary="Bidirectional process reward model scoring", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(ServiceError)
    async def refused(request: Request, error: ServiceError) -> JSONResponse:
        return JSONResponse(
            {"error": str(error)},
            status_code=error.status,
            headers={"Retry-After": "1"} if error.status == 503 and error.retry else None,
        )

    if cfg.api_key is not None:

        @app.middleware("http")
        async def authorize(request: Request, call_next):
            if request.url.path == "/health" or _bearer_matches(request, cfg.api_key):
                return await call_next(request)
            return JSONResponse(
                {
                    "error": "this server wants an API key: send 'Authorization: Bearer <key>' (--api-key or "
                    f"{API_KEY_ENV} of the server)"
                },
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.post("/v1/score", openapi_extra=_body_schema({"oneOf": [ScoreItem.model_json_schema(), _ITEMS.json_schema()]}))
    async def score(request: Request) -> dict | list[dict]:
        """One item (an object) or many (a list of objects); the answer has the same shape."""
        body = await _json(request, cfg.max_body_bytes)
        many = isinstance(body, list)
        if many and not body:
            raise ServiceError(400, "the body is an empty list: no solutions to score")
        try:
            items = _ITEMS.validate_python(body if many else [body])
        except ValidationError as error:
            errors = error.errors() if many else [{**e, "loc": e["loc"][1:]} for e in error.errors()]
            raise ServiceError(400, _describe(errors)) from None
        out = await service.score(items)
        return out if many else out[0]

    @app.post("/get_reward", openapi_extra=_body_schema(RewardRequest.model_json_schema()))
    async def get_reward(request: Request) -> dict:
        try:
            body = RewardRequest.model_validate(await _json(request, cfg.max_body_bytes))
        except ValidationError as error:
            raise ServiceError(400, _describe(error.errors())) from None
        return await service.reward(body)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Up or down for a load balancer; it names no path, since it answers without the API key."""
        if why := service.failure():
            return JSONResponse({"status": "down", "error": why, "mode": scorer.mode}, status_code=503)
        return JSONResponse({"status": "ok", "mode": scorer.mode, "queued": service.batcher.queued})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return service.metrics()

    return app


def serve(cfg: ServeConfig) -> None:
    """Load the model, then serve until SIGINT/SIGTERM; requests already accepted are finished first."""
    import uvicorn

    if cfg.engine == "vllm":
        scorer = VLLMScorer.from_pretrained(
            cfg.model, cfg.max_length, cfg.prm_kind, cfg.prm_reference, cfg.prm_mode, **json.loads(cfg.engine_args)
        )
    else:
        scorer = Scorer.from_settings(cfg.model, cfg)
    log.info("serving %s (%s) on http://%s:%d", cfg.model, scorer.mode, cfg.host, cfg.port)
    if cfg.api_key is None and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving on %s without an API key: anyone who reaches port %d can use this model (set %s)",
            cfg.host,
            cfg.port,
            API_KEY_ENV,
        )
    uvicorn.run(build_app(scorer, cfg, owns_scorer=True), host=cfg.host, port=cfg.port, log_level="info")
