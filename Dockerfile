# Multi-stage build of meshd and meshctl into a distroless image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/meshd ./cmd/meshctl \
 && mkdir -m 0700 /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/meshd /out/meshctl /usr/local/bin/
# The nonroot user's (65532) own directory: a named volume mounted here starts
# owned by it, so that `meshctl token keygen --out /var/lib/agentmesh/auth.key`
# works in the container (deploy/compose does so).
COPY --from=build --chown=65532:65532 /out/state /var/lib/agentmesh
ENV PATH=/usr/local/bin
EXPOSE 7700
ENTRYPOINT []
# Beyond loopback a hub needs --allow-remote and a key (meshctl token keygen):
# mount one, readable by uid 65532 and by no other user, at
# /run/secrets/auth.key. Without it meshd exits at once (status 2).
CMD ["meshd", "--listen", "0.0.0.0:7700", "--allow-remote", "--auth-key", "/run/secrets/auth.key"]
