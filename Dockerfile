# Multi-stage build of meshd and meshctl into a distroless image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/meshd ./cmd/meshctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/meshd /out/meshctl /usr/local/bin/
ENV PATH=/usr/local/bin
EXPOSE 7700
ENTRYPOINT []
CMD ["meshd", "--listen", "0.0.0.0:7700"]
